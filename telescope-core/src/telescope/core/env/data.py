"""Loading dataset rows: local files (JSON/JSONL read directly) or the Hugging Face hub."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DatasetKwargs", "load_rows", "read_local_rows", "select_rows"]


class DatasetKwargs(BaseModel):
    """Where an environment's rows come from (mix into a kwargs model)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    dataset_name: str | None = None
    """Hugging Face dataset id (null = the environment's default source)."""
    dataset_subset: str | None = None
    """Dataset configuration name (null = the default one)."""
    dataset_split: str | None = None
    """Split to read (null = the environment's default, usually train)."""
    data_files: str | list[str] | None = None
    """Local file(s) to read instead of the hub (.json, .jsonl, .parquet, .csv)."""
    sample_data: bool = False
    """Use the small sample file shipped with the package (offline smoke tests)."""
    shuffle: bool = False
    """Shuffle the rows (seeded by `seed`) before taking the first num_samples."""
    seed: int = 0
    """Seed for shuffling and any procedural generation."""
    num_samples: int = Field(default=-1, ge=-1)
    """Keep at most this many samples (-1 = all)."""


def read_local_rows(files: str | Path | list[str] | list[Path]) -> list[dict[str, Any]]:
    """Rows of local data files; JSON/JSONL are read without importing ``datasets``."""
    paths = [Path(f) for f in ([files] if isinstance(files, (str, Path)) else files)]
    rows: list[dict[str, Any]] = []
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(f"data file {str(path)!r} does not exist (check `data_files`)")
        if path.suffix == ".jsonl":
            with path.open(encoding="utf-8") as fh:
                rows += [json.loads(line) for line in fh if line.strip()]
        elif path.suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            rows += data if isinstance(data, list) else data.get("data", [data])
        elif path.suffix in (".parquet", ".csv"):
            import datasets  # heavy: only for formats we do not read ourselves

            builder = path.suffix.lstrip(".")
            rows += list(datasets.load_dataset(builder, data_files=str(path), split="train"))
        else:
            raise ValueError(
                f"data file {str(path)!r}: unsupported extension (use .json, .jsonl, .parquet, .csv)"
            )
    return rows


def load_rows(
    *,
    dataset_name: str | None,
    subset: str | None = None,
    split: str | None = "train",
    data_files: str | list[str] | None = None,
    sample_file: Path | None = None,
    use_sample: bool = False,
) -> list[dict[str, Any]]:
    """Rows from ``data_files``, the shipped sample file, or the hub dataset, in that order."""
    if data_files:
        return read_local_rows(data_files)
    if use_sample:
        if sample_file is None:
            raise ValueError("this environment ships no sample data: set `data_files` or `dataset_name`")
        return read_local_rows(sample_file)
    if not dataset_name:
        raise ValueError("no data source: set `dataset_name`, `data_files` or `sample_data: true`")
    import datasets

    try:
        return list(datasets.load_dataset(dataset_name, subset, split=split))
    except Exception as exc:  # re-raised with what to do about it
        raise RuntimeError(
            f"could not load dataset {dataset_name!r} (subset {subset!r}, split {split!r}): "
            f"{type(exc).__name__}: {exc}. Offline? Set `data_files` to a local copy, or "
            "`sample_data: true` for the small shipped sample."
        ) from exc


def select_rows(rows: list[Any], *, num_samples: int = -1, shuffle: bool = False, seed: int = 0) -> list[Any]:
    """Optionally shuffle (private seeded RNG, never the global one), then cut to ``num_samples``."""
    rows = list(rows)
    if shuffle:
        random.Random(seed).shuffle(rows)
    return rows if num_samples < 0 else rows[:num_samples]
