"""A model's ``config.json`` as vLLM reads it: the text model's settings, by one rule for every reader
(the memory plan, the checkpoint check).

A multimodal config nests the language model's settings under ``text_config`` (or ``llm_config``,
``language_config``); the top level keeps what applies to the whole model (``torch_dtype``/``dtype``,
``quantization_config``, ``tie_word_embeddings``), which the nested settings inherit unless they set
it themselves.  Pure: data in, data out.
"""

from __future__ import annotations

NESTED = ("text_config", "llm_config", "language_config")
INHERITED = ("tie_word_embeddings", "torch_dtype", "dtype", "quantization_config")


def text_config(config: dict) -> tuple[dict, str | None]:
    """(the text model's settings, what is wrong with the nesting or None).

    ``text_config`` when present (it must be an object), else the first of ``llm_config`` and
    ``language_config`` that is an object, with the top level's :data:`INHERITED` keys it does not
    set; else ``config`` itself.  A ``text_config`` that is not an object is the problem returned,
    with ``config`` itself as the settings."""
    nested = config.get("text_config")
    if nested is None:
        nested = next((config[k] for k in NESTED[1:] if isinstance(config.get(k), dict)), None)
    if nested is None:
        return config, None
    if not isinstance(nested, dict):
        return config, "'text_config' must be an object"
    merged = dict(nested)
    for key in INHERITED:
        if key not in merged and key in config:
            merged[key] = config[key]
    return merged, None
