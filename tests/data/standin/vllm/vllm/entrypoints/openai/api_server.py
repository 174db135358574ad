"""Stand-in OpenAI-compatible server module (tests only)."""

BANNER = "vllm api server"


def banner():
    return BANNER
