"""The fsdp plugin registers lazily: importing it loads no torch/transformers."""

from __future__ import annotations

import subprocess
import sys


def test_plugin_import_is_light_and_registers_fsdp() -> None:
    code = (
        "import sys\n"
        "import telescope.fsdp.plugin\n"
        "from telescope.core.plugins import load_plugins\n"
        "_, reg = load_plugins()\n"
        "c = reg.get('trainer_backend', 'fsdp')\n"
        "assert c.factory == 'telescope.fsdp.backend:create_fsdp_backend', c.factory\n"
        "assert c.kwargs_model.__name__ == 'FSDPBackendKwargs'\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'ray') if m in sys.modules)\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
