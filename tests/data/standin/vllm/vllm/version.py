__version__ = "0.26.0"
__version_tuple__ = (0, 26, 0)
