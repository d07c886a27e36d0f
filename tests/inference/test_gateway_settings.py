"""The gateway's settings come from the run config; the tool-call format is a config field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from telescope.core.inference.gateway.app import GatewaySettings
from telescope.core.testing import make_config


def test_the_run_config_chooses_how_tool_calls_are_read() -> None:
    assert GatewaySettings.from_config(make_config()).tool_call_parser == "xml"
    cfg = make_config(agent_tool_call_parser="python", max_model_len=512, enable_thinking=True)
    settings = GatewaySettings.from_config(cfg)
    assert (settings.tool_call_parser, settings.max_model_len, settings.enable_thinking) == ("python", 512, True)
    # what the caller passes wins (telescope serve --tool_call_parser)
    assert GatewaySettings.from_config(cfg, tool_call_parser="xml").tool_call_parser == "xml"


def test_an_unknown_format_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="agent_tool_call_parser"):
        make_config(agent_tool_call_parser="json")
