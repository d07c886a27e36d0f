"""examples/i3_code_cpu.yaml runs for real (Ray, the transformers engine, FSDP, the tiny model, the local
bubblewrap provider): every completion reaches a sandbox (the response prefix opens its code block),
is run and scored there, and the run directory holds each sandbox's spans and the sandbox/* metrics."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from rundriver import finish, launch

from telescope.core.observe.rundir.reader import RunDirReader

pytest.importorskip("ray")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.slow
def test_the_i3_code_cpu_example_runs_every_completion_in_a_sandbox(tmp_path: Path) -> None:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (run telescope-sandboxes/install-bubblewrap.sh)")
    cfg = yaml.safe_load((EXAMPLES / "i3_code_cpu.yaml").read_text())
    cfg.update(run_dir=str(tmp_path / "run"), number_of_steps=2)
    config, log = tmp_path / "run.yaml", tmp_path / "cli.log"
    config.write_text(yaml.safe_dump(cfg))
    assert finish(launch(config, log), log, 480) == 0, log.read_text()[-3000:]
    reader = RunDirReader(tmp_path / "run")
    rows = [r for r in reader.rollouts() if r.get("discard_reason") is None]
    assert len(rows) == 2 * 2 * 4  # steps x groups x group_size
    for row in rows:
        turns = {t["info_key"]: t["info_value"] for t in row["info_turns"]}
        assert row["prompt_text"].endswith("<|im_start|>assistant\n```python\n")
        assert "generated_code" in turns and "error" not in turns  # extracted, run, no sandbox failure
        assert row["sample_metrics"]["sandbox_error"] == 0.0 and row["sample_metrics"]["retry_count"] == 0.0
    spans = [e for e in reader.events() if e.get("type") == "sandbox" and e.get("phase") == "end"]
    assert {"create", "upload", "execute", "destroy"} <= {e["name"] for e in spans}
    runs = [
        e
        for e in spans
        if e["name"] == "execute" and e["attrs"]["command"] == "python3 runner.py bundle.json"
    ]
    assert len({e["attrs"]["sandbox_id"] for e in runs}) >= 1 and all(
        e["attrs"]["exit_code"] == 0 for e in runs
    )
    metrics = [s["metrics"] for s in reader.steps()]
    assert sum(m["sandbox/execs"] for m in metrics) >= len(rows)
    assert all(m.get("sandbox/exec_p50_s", 1.0) > 0 for m in metrics)
