"""The fsdp plugin registers lazily: importing it loads no torch/transformers."""

from __future__ import annotations

from telescope.core.testing import heavy_imports_after


def test_plugin_import_is_light_and_registers_fsdp() -> None:
    code = (
        "import telescope.fsdp.plugin\n"
        "from telescope.core.plugins import load_plugins\n"
        "_, reg = load_plugins()\n"
        "c = reg.get('trainer_backend', 'fsdp')\n"
        "assert c.factory == 'telescope.fsdp.backend:create_fsdp_backend', c.factory\n"
        "assert c.kwargs_model.__name__ == 'FSDPBackendKwargs'\n"
    )
    assert heavy_imports_after(code, ("torch", "transformers", "ray")) == []
