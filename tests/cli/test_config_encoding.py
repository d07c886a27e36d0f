"""A config file that is not UTF-8 text gets one line and exit code 2, like every other bad file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from telescope.core.config import ConfigError
from telescope.core.config.loader import load_yaml_file

TEXT = "model: telescope/tiny\nseed: 3\n"


@pytest.mark.parametrize(
    ("data", "what", "offset"),
    [
        (TEXT.encode("utf-16"), "it looks like UTF-16", 0),  # with a BOM, as Windows editors save it
        (TEXT.encode("utf-16-le"), "it looks like UTF-16", 1),  # no BOM: valid UTF-8, but NUL bytes
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "it looks like a binary file", 0),
        ("seed: 3\nname: café\n".encode("latin-1"), "it is in another encoding", 17),
    ],
)
def test_undecodable_config_is_one_clear_error(tmp_path: Path, data: bytes, what: str, offset: int) -> None:
    path = tmp_path / "run.yaml"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as info:
        load_yaml_file(path)
    message = str(info.value)
    assert (
        f"'{path}' is not a UTF-8 text file ({what}; byte 0x{data[offset]:02x} at offset {offset})" in message
    )
    assert message.endswith("save it as UTF-8 YAML")


def test_utf8_with_a_bom_is_read(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_bytes(TEXT.encode("utf-8-sig"))
    assert load_yaml_file(path) == {"model": "telescope/tiny", "seed": 3}


def test_the_cli_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_bytes(TEXT.encode("utf-16"))
    code = "import sys; from telescope.cli.app import main; sys.argv[0] = 'telescope'; main()"
    out = subprocess.run(
        [sys.executable, "-c", code, "train", str(path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and "UnicodeDecodeError" not in out.stderr
    assert "is not a UTF-8 text file (it looks like UTF-16" in out.stderr
