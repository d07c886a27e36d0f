"""Secrets in a config (an API key in an environment's provider kwargs, a token in env vars) are
redacted wherever the config is written out: config.yaml, checkpoints, W&B, MLflow, TensorBoard,
the dashboard and ``telescope config show``. Workers receive the real values (``to_dict``)."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["REDACTED", "is_secret_key", "redact_secrets"]

REDACTED = "***"
# api_key / apiKey / OPENAI_API_KEY, *_token / token (not max_tokens), secret(s), password, credential(s)
_SECRET_KEY = re.compile(
    r"(api[_-]?key|access[_-]?key|(^|[_-])token$|secret|passw(or)?d|credential|private[_-]?key)",
    re.IGNORECASE,
)


def is_secret_key(key: str) -> bool:
    """Whether a mapping key names a secret (``api_key``, ``HF_TOKEN``, ``client_secret``, ``password``)."""
    return bool(_SECRET_KEY.search(key))


def redact_secrets(data: Any) -> Any:
    """``data`` (plain config data) with every non-empty value under a secret-looking key replaced."""
    if isinstance(data, dict):
        return {
            key: REDACTED
            if isinstance(key, str) and is_secret_key(key) and value not in (None, "")
            else redact_secrets(value)
            for key, value in data.items()
        }
    if isinstance(data, list):
        return [redact_secrets(item) for item in data]
    return data
