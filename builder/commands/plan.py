"""(not yet implemented)"""
