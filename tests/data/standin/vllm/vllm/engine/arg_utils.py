"""Stand-in engine arguments (tests only)."""

DEFAULT_MAX_MODEL_LEN = None


def default_max_model_len(config_max_len):
    """Upstream behaviour: use the model's full context window."""
    if DEFAULT_MAX_MODEL_LEN is None:
        return config_max_len
    return min(DEFAULT_MAX_MODEL_LEN, config_max_len)
