"""Native FSDP checkpoint -> Hugging Face folder: logits round trip, shards, batch form, CLI, errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from ckpt_helpers import make_backend, resume_config, run_steps, weights  # noqa: E402

from telescope.core.checkpoint import (  # noqa: E402
    CheckpointManager,
    ConversionError,
    convert_all,
    convert_checkpoint,
    is_hf_checkpoint,
    is_native_checkpoint,
)
from telescope.core.checkpoint.convert import (  # noqa: E402
    match_config_dtype,
    parse_size,
    plan_shards,
    shard_file_names,
    stored_float_dtype,
    write_safetensors_shards,
)

pytestmark = pytest.mark.usefixtures("one_rank_group")

IDS = torch.tensor([[5, 17, 42, 8, 91, 3, 60, 11, 29, 77], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])


def trained_checkpoint(
    model_dir: str, root: Path, steps: tuple[int, ...] = (1,)
) -> tuple[Any, dict[str, Path]]:
    """Train, committing a checkpoint after each step in ``steps``; returns the backend and paths."""
    cfg = resume_config(model_dir, learning_rate=5e-2)
    backend, mgr, paths, done = make_backend(cfg), CheckpointManager(root), {}, 0
    for step in steps:
        run_steps(backend, cfg, range(done, step))
        done = step
        partial = mgr.begin(step)
        backend.save_checkpoint(str(partial))
        paths[f"step_{step}"] = mgr.commit(partial, step)
    return backend, paths


@torch.no_grad()
def trainer_logits(backend: Any) -> Any:
    """The FSDP model's logits, one row at a time (its packed attention takes one row)."""
    positions = torch.arange(IDS.shape[1])[None]
    rows = [
        backend.state.model(input_ids=row[None], position_ids=positions, use_cache=False).logits
        for row in IDS
    ]
    return torch.cat(rows).float()


@torch.no_grad()
def hf_logits(folder: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, attn_implementation="sdpa")
    return model(input_ids=IDS, use_cache=False).logits.float(), model


def test_round_trip_tied_model_with_tokenizer(builtin_tiny_dir: str, tmp_path: Path) -> None:
    from safetensors import safe_open
    from transformers import AutoTokenizer

    backend, paths = trained_checkpoint(builtin_tiny_dir, tmp_path / "ckpts")
    src = paths["step_1"]
    assert is_native_checkpoint(src) and not is_hf_checkpoint(src)
    from torch.distributed.checkpoint import FileSystemReader

    dcp_keys = set(FileSystemReader(str(src)).read_metadata().state_dict_metadata)
    assert (
        "model.model.embed_tokens.weight" in dcp_keys and "model.lm_head.weight" not in dcp_keys
    )  # stored once
    out = convert_checkpoint(src, tmp_path / "hf")
    assert is_hf_checkpoint(out) and not is_native_checkpoint(out)
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= names
    # float32 weights under a float32 config: the config is copied byte for byte
    assert (out / "config.json").read_bytes() == (src / "hf_meta" / "config.json").read_bytes()
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        stored = set(f.keys())
    assert "lm_head.weight" not in stored  # tied: from_pretrained re-ties it to the embeddings
    logits, model = hf_logits(out)
    torch.testing.assert_close(logits, trainer_logits(backend), atol=1e-6, rtol=0)
    trained = weights(backend)
    initial = initial_state_dict(builtin_tiny_dir)
    assert any((trained[k] - initial[k]).abs().max() > 1e-4 for k in initial)  # it did train
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(
            tensor, trained.get(name, trained["model.embed_tokens.weight"]), atol=0, rtol=0
        )
    tok = AutoTokenizer.from_pretrained(str(out))
    ref = AutoTokenizer.from_pretrained(builtin_tiny_dir)
    assert tok("hello world")["input_ids"] == ref("hello world")["input_ids"]


def initial_state_dict(model_dir: str) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()


def test_config_names_the_stored_dtype_so_a_plain_from_pretrained_gives_the_trainer_logits(
    tmp_path: Path,
) -> None:
    from fsdp_helpers import save_tiny_qwen2
    from transformers import AutoModelForCausalLM

    model_dir = Path(save_tiny_qwen2(tmp_path / "base", tied=False, seed=5))
    base = json.loads((model_dir / "config.json").read_text())
    base.update(dtype="bfloat16", torch_dtype="bfloat16")  # as Qwen / Llama base models ship
    (model_dir / "config.json").write_text(json.dumps(base))
    backend, paths = trained_checkpoint(str(model_dir), tmp_path / "ckpts")  # model_dtype: float32
    assert json.loads((paths["step_1"] / "hf_meta" / "config.json").read_text())["dtype"] == "bfloat16"
    out = convert_checkpoint(paths["step_1"], tmp_path / "hf")
    written = json.loads((out / "config.json").read_text())
    assert written["dtype"] == written["torch_dtype"] == "float32"
    rest = ("dtype", "torch_dtype")
    assert {k: v for k, v in written.items() if k not in rest} == {
        k: v for k, v in base.items() if k not in rest
    }
    with torch.no_grad():  # no dtype argument: transformers follows the config
        model = AutoModelForCausalLM.from_pretrained(str(out), attn_implementation="sdpa")
        assert model.dtype == torch.float32
        logits = model(input_ids=IDS, use_cache=False).logits.float()
    torch.testing.assert_close(logits, trainer_logits(backend), atol=1e-6, rtol=0)


def test_stored_dtype_is_read_from_the_headers_and_set_where_the_config_names_one(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file(
        {"a": torch.zeros(64, dtype=torch.bfloat16), "ids": torch.zeros(512, dtype=torch.int64)},
        str(tmp_path / "model-00001-of-00002.safetensors"),
    )
    save_file(
        {"norm": torch.zeros(8, dtype=torch.float32)}, str(tmp_path / "model-00002-of-00002.safetensors")
    )
    assert stored_float_dtype(tmp_path) == "bfloat16"  # 128 bf16 bytes vs 32 fp32 bytes; ints ignored
    config = {"model_type": "x", "text_config": {"torch_dtype": "float32", "hidden_size": 4}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert match_config_dtype(tmp_path) == "bfloat16"
    written = json.loads((tmp_path / "config.json").read_text())
    assert written == {
        "model_type": "x",
        "dtype": "bfloat16",
        "text_config": {"torch_dtype": "bfloat16", "hidden_size": 4},
    }
    (tmp_path / "config.json").write_text('{ "dtype": "bfloat16" }')  # already right: left as written
    assert match_config_dtype(tmp_path) == "bfloat16"
    assert (tmp_path / "config.json").read_text() == '{ "dtype": "bfloat16" }'
    empty = tmp_path / "empty"
    empty.mkdir()
    assert stored_float_dtype(empty) is None and match_config_dtype(empty) is None


def test_small_shard_size_writes_an_index_that_loads(untied_model_dir: str, tmp_path: Path) -> None:
    backend, paths = trained_checkpoint(untied_model_dir, tmp_path / "ckpts")
    out = convert_checkpoint(paths["step_1"], tmp_path / "hf", max_shard_size="20KB")
    shards = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    trained = weights(backend)
    assert set(index["weight_map"]) == set(trained)  # untied: lm_head.weight kept
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in trained.values())
    logits, _ = hf_logits(out)
    torch.testing.assert_close(logits, trainer_logits(backend), atol=1e-6, rtol=0)


def test_batch_conversion_and_cli(untied_model_dir: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from telescope.cli.commands.checkpoint import app

    _, paths = trained_checkpoint(untied_model_dir, tmp_path / "ckpts", steps=(1, 2))
    results = convert_all(tmp_path / "ckpts", tmp_path / "hf")
    assert [(r.out.name, r.skipped) for r in results] == [("step_1", False), ("step_2", False)]
    first, _ = hf_logits(tmp_path / "hf" / "step_1")
    second, _ = hf_logits(tmp_path / "hf" / "step_2")
    assert (first - second).abs().max() > 1e-4  # two different checkpoints, each converted
    shutil.rmtree(tmp_path / "hf" / "step_2")
    runner = CliRunner()
    res = runner.invoke(app, ["convert", str(tmp_path / "ckpts"), "--out", str(tmp_path / "hf")])
    assert res.exit_code == 0, res.output
    assert "step_1" in res.output and "1 converted, 1 skipped" in res.output
    again, _ = hf_logits(tmp_path / "hf" / "step_2")
    torch.testing.assert_close(again, second, atol=0, rtol=0)
    res = runner.invoke(app, ["convert", str(paths["step_1"]), "--out", str(tmp_path / "single")])
    assert res.exit_code == 0 and is_hf_checkpoint(tmp_path / "single"), res.output
    res = runner.invoke(app, ["convert", str(paths["step_1"]), "--out", str(tmp_path / "single")])
    assert res.exit_code == 2 and "--overwrite" in res.output
    res = runner.invoke(app, ["convert", str(tmp_path / "single"), "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "already in Hugging Face format" in res.output
    res = runner.invoke(app, ["convert", str(tmp_path / "nope"), "--out", str(tmp_path / "x")])
    assert res.exit_code == 2 and "does not exist" in res.output


def test_errors_overwrite_and_megatron(untied_model_dir: str, tmp_path: Path) -> None:
    _, paths = trained_checkpoint(untied_model_dir, tmp_path / "ckpts")
    src = paths["step_1"]
    out = convert_checkpoint(src, tmp_path / "hf")
    with pytest.raises(ConversionError, match="already exists.*--overwrite"):
        convert_checkpoint(src, out)
    (out / "stale.txt").write_text("from an older conversion")
    convert_checkpoint(src, out, overwrite=True)
    assert not (out / "stale.txt").exists() and is_hf_checkpoint(out)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp folder left
    with pytest.raises(ConversionError, match="already in Hugging Face format"):
        convert_checkpoint(untied_model_dir, tmp_path / "y")
    with pytest.raises(ConversionError, match="not a Telescope checkpoint"):
        convert_checkpoint(tmp_path, tmp_path / "z")

    mega = tmp_path / "mega"
    mega.mkdir()
    (mega / "trainer_meta.json").write_text(json.dumps({"backend": "megatron"}))
    with pytest.raises(NotImplementedError, match="Megatron dist_checkpointing"):
        convert_checkpoint(mega, tmp_path / "mega_hf")
    assert not (tmp_path / "mega_hf").exists()
    shutil.copytree(out, mega / "hf")  # a Megatron checkpoint saved with checkpoint_hf_weights
    converted = convert_checkpoint(mega, tmp_path / "mega_hf")
    torch.testing.assert_close(hf_logits(converted)[0], hf_logits(out)[0], atol=0, rtol=0)


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (1000, 1000),
        ("5GB", 5 * 10**9),
        ("500MB", 500 * 10**6),
        ("2GiB", 2 * 2**30),
        ("20KB", 20_000),
        ("7", 7),
    ],
)
def test_parse_size(size: int | str, expected: int) -> None:
    assert parse_size(size) == expected


def test_parse_size_errors_and_shard_plan() -> None:
    for bad in ("five", "0", "-3MB"):
        with pytest.raises(ConversionError, match="max_shard_size"):
            parse_size(bad)
    sizes = [("a", 4), ("b", 4), ("c", 9), ("d", 1), ("e", 3)]
    assert plan_shards(sizes, 8) == [["a", "b"], ["c"], ["d", "e"]]  # an oversize tensor stands alone
    assert plan_shards(sizes, 100) == [["a", "b", "c", "d", "e"]]


def test_safetensors_shards_are_written_one_file_at_a_time_with_an_index(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    tensors = {
        name: torch.full((n,), float(i), dtype=torch.float32)
        for i, (name, n) in enumerate([("a", 1), ("b", 1), ("c", 3), ("d", 1)])
    }
    sizes = [(name, t.numel() * 4) for name, t in tensors.items()]
    reads: list[list[str]] = []

    def read(names: list[str]) -> dict[str, Any]:
        reads.append(names)
        return {n: tensors[n] for n in names}

    write_safetensors_shards(tmp_path, sizes, 8, read)
    files = shard_file_names(3)
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert reads == [["a", "b"], ["c"], ["d"]]  # one shard in memory at a time
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index == {
        "metadata": {"total_size": 24},
        "weight_map": {"a": files[0], "b": files[0], "c": files[1], "d": files[2]},
    }
    for name, file in index["weight_map"].items():
        assert torch.equal(load_file(str(tmp_path / file))[name], tensors[name])

    single = tmp_path / "single"
    single.mkdir()
    write_safetensors_shards(single, sizes, 100, read)
    assert shard_file_names(1) == ["model.safetensors"]
    assert sorted(p.name for p in single.iterdir()) == ["model.safetensors"]  # one file: no index
