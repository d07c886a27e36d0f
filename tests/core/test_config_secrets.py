"""Secrets in a config never reach config.yaml, checkpoints, the loggers or ``config show``."""

from __future__ import annotations

import pytest

from telescope.core.config import TelescopeConfig, config_to_yaml
from telescope.core.config.secrets import REDACTED, is_secret_key
from telescope.core.observe.rundir.layout import config_to_dict


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("api_key", True),
        ("OPENAI_API_KEY", True),
        ("apiKey", True),
        ("HF_TOKEN", True),
        ("token", True),
        ("client_secret", True),
        ("password", True),
        ("aws_secret_access_key", True),
        ("credentials", True),
        ("max_tokens", False),
        ("tokenizer", False),
        ("num_tokens", False),
        ("model", False),
        ("request_timeout_s", False),
    ],
)
def test_secret_keys(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_a_provider_api_key_is_redacted_everywhere_the_config_is_written() -> None:
    live = "sk-live-4242"
    kwargs = {
        "sandbox_provider": "e2b",
        "provider_kwargs": {"api_key": live, "request_timeout_s": 30},
        "env": {"HF_TOKEN": live, "LANG": "C"},
    }
    cfg = TelescopeConfig(environments=[{"name": "code", "kwargs": kwargs}])
    dumped = config_to_dict(cfg)
    env_kwargs = dumped["environments"][0]["kwargs"]
    assert env_kwargs["provider_kwargs"] == {"api_key": REDACTED, "request_timeout_s": 30}
    assert env_kwargs["env"] == {"HF_TOKEN": REDACTED, "LANG": "C"}
    assert live not in config_to_yaml(cfg)
    assert cfg.to_dict()["environments"][0]["kwargs"]["provider_kwargs"]["api_key"] == live  # workers get it
