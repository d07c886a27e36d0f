"""The Dockerfile (not built here: no GPU or registry in CI) against what its comments promise and the rest
of the repository: vLLM pinned to the newest supported release, the one the vLLM contract tests read, and
the same Telescope extras as scripts/bootstrap.sh (Daytona's SDK breaks Ray: never in the image)."""

from __future__ import annotations

import re
from pathlib import Path

from telescope.core.inference.auto import VLLM_MAX_VERSION, VLLM_MIN_VERSION, vllm_version_problem

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _arg(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE, re.M)
    assert match, f"Dockerfile has no ARG {name}=..."
    return match[1]


def _make_variable(name: str) -> str:
    match = re.search(rf"^{name} \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert match, f"the Makefile has no {name} ?= ..."
    return match[1]


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def test_the_contract_tests_read_both_ends_of_the_supported_range() -> None:
    oldest, newest = _make_variable("VLLM_CONTRACT_OLDEST"), _make_variable("VLLM_CONTRACT_NEWEST")
    assert _minor(oldest) == VLLM_MIN_VERSION and _minor(newest) == VLLM_MAX_VERSION
    assert vllm_version_problem(oldest) is None and vllm_version_problem(newest) is None


def test_vllm_is_pinned_to_the_newest_contract_tested_release() -> None:
    spec = _arg("VLLM_SPEC")
    assert re.fullmatch(r"vllm==\d+\.\d+\.\d+", spec), f"unpinned vLLM in the image: {spec}"
    assert spec.removeprefix("vllm==") == _make_variable("VLLM_CONTRACT_NEWEST"), (
        "the image's vLLM and the newest one make test-vllm-contract reads must be the same release"
    )


def test_the_base_image_is_cuda_13_which_the_pinned_vllms_torch_is_built_for() -> None:
    # vLLM 0.33.0 pins torch 2.14.0, whose PyPI wheels are built for CUDA 13.0 (cuda-toolkit 13.0.3):
    # flash-attn and TransformerEngine compile only when nvcc's major version matches torch's.
    assert _arg("VLLM_SPEC") == "vllm==0.33.0"
    assert _arg("CUDA_IMAGE").startswith("nvidia/cuda:13.0.")
    # TransformerEngine's core library for CUDA 13, not 12
    assert "transformer-engine[core_cu13,pytorch]" in DOCKERFILE and "core_cu12" not in DOCKERFILE


def test_the_image_installs_the_extras_bootstrap_installs() -> None:
    bootstrap = (ROOT / "scripts" / "bootstrap.sh").read_text()
    pattern = r'"\./telescope-sandboxes\[([^\]]*)\]"'
    main_install = re.findall(pattern, bootstrap)[0]  # the second one is the separate Daytona venv
    assert re.findall(pattern, DOCKERFILE) == [main_install] == ["e2b,modal,prime"]
    instructions = re.sub(r"#.*", "", DOCKERFILE)
    assert "[all]" not in instructions and "daytona" not in instructions
