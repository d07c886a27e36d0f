"""The Dockerfile (not built here: no GPU or registry in CI) against what its comments promise and the rest
of the repository: a pinned vLLM at or above the engine's floor, the one the vLLM contract tests read, and
the same Telescope extras as scripts/bootstrap.sh (Daytona's SDK breaks Ray: never in the image)."""

from __future__ import annotations

import re
from pathlib import Path

from telescope.core.inference.auto import VLLM_MIN_VERSION, vllm_version_problem

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _arg(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE, re.M)
    assert match, f"Dockerfile has no ARG {name}=..."
    return match[1]


def test_vllm_is_pinned_to_the_contract_tested_release_above_the_floor() -> None:
    spec = _arg("VLLM_SPEC")
    assert re.fullmatch(r"vllm==\d+\.\d+\.\d+", spec), f"unpinned vLLM in the image: {spec}"
    version = spec.removeprefix("vllm==")
    assert vllm_version_problem(version) is None, (version, VLLM_MIN_VERSION)
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(rf"^VLLM_CONTRACT_VERSION \?= {re.escape(version)}$", makefile, re.M), (
        "the image's vLLM and the one make test-vllm-contract checks must be the same release"
    )


def test_the_base_image_is_cuda_12_8_which_the_pinned_vllms_torch_is_built_for() -> None:
    # vLLM 0.17.1 pins torch 2.10.0, whose PyPI wheels are built for CUDA 12.8 (nvidia-*-cu12 12.8.x):
    # flash-attn and TransformerEngine compile only when nvcc's major version matches torch's.
    assert _arg("VLLM_SPEC") == "vllm==0.17.1"
    assert _arg("CUDA_IMAGE").startswith("nvidia/cuda:12.8.")
    # TransformerEngine's core library for CUDA 12, not 13 (megatron-core's te extra asks for core_cu13)
    assert "transformer-engine[core_cu12,pytorch]" in DOCKERFILE and "core_cu13" not in DOCKERFILE.replace(
        "asks for core_cu13", ""
    )


def test_the_image_installs_the_extras_bootstrap_installs() -> None:
    bootstrap = (ROOT / "scripts" / "bootstrap.sh").read_text()
    pattern = r'"\./telescope-sandboxes\[([^\]]*)\]"'
    main_install = re.findall(pattern, bootstrap)[0]  # the second one is the separate Daytona venv
    assert re.findall(pattern, DOCKERFILE) == [main_install] == ["e2b,modal,prime"]
    instructions = re.sub(r"#.*", "", DOCKERFILE)
    assert "[all]" not in instructions and "daytona" not in instructions
