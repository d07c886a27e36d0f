"""Which run-directory files the W&B logger uploads, and when (``event_upload_interval_seconds``).

Every interval: ``events/tail.jsonl.zst`` when it changed since its last upload (the live view:
the events of the last ``event_tail_window_seconds``), each event or rollout block that
is closed (a later block exists) and not yet uploaded, and the run's small record files
(``RECORD_FILES``: run.json, config.yaml, metrics.jsonl, evals/metrics.jsonl) when they
changed, so ``telescope ui --wandb`` can show a run from W&B alone, live. Open blocks and the
bulky records (``FINAL_FILES``: system.jsonl, evals/samples.jsonl) are uploaded by
``upload_all`` at finish. Uploading a file that grows (the open event block) every few
seconds would resend it whole each time; the tail window exists to avoid that.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from telescope.core.observe.periodic import IntervalGate
from telescope.core.observe.rundir.blocks import block_files
from telescope.core.observe.rundir.layout import (
    CONFIG_FILE,
    EVAL_METRICS_FILE,
    EVAL_SAMPLES_FILE,
    EVENTS_DIR,
    EVENTS_TAIL_FILE,
    METRICS_FILE,
    ROLLOUTS_DIR,
    RUN_FILE,
    SYSTEM_FILE,
)

__all__ = ["FINAL_FILES", "RECORD_FILES", "BlockUploader"]

#: Small run-directory files uploaded every interval when they changed (the dashboard's records).
RECORD_FILES = (RUN_FILE, CONFIG_FILE, METRICS_FILE, EVAL_METRICS_FILE)
#: Bulky run-directory records uploaded once, at finish.
FINAL_FILES = (SYSTEM_FILE, EVAL_SAMPLES_FILE)


def _signature(path: Path, by_content: bool = False) -> tuple[int, int | str] | None:
    """(size, mtime_ns), or (size, sha1) for small rewritten files whose content may repeat."""
    try:
        if by_content:
            data = path.read_bytes()
            return len(data), hashlib.sha1(data).hexdigest()
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns


class BlockUploader:
    """Calls ``save(path)`` for the files due (see module doc)."""

    def __init__(
        self,
        save: Callable[[Path], Any],
        run_dir: Path,
        interval_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._save = save
        self._run_dir = run_dir
        self._gate = IntervalGate(interval_s, clock)
        self._uploaded: dict[Path, tuple[int, int | str] | None] = {}
        self.uploads = 0
        """Number of ``save`` calls so far."""

    def _upload(self, path: Path, signature: tuple[int, int | str] | None) -> None:
        self._save(path)
        self._uploaded[path] = signature
        self.uploads += 1

    def _blocks(self) -> list[list[Path]]:
        return [[p for _, p in block_files(self._run_dir / folder)] for folder in (EVENTS_DIR, ROLLOUTS_DIR)]

    def tick(self) -> int:
        """Upload what is due now (nothing before the interval has passed); returns the count."""
        if not self._gate.due():
            return 0
        return self.upload_changed(closed_blocks_only=True)

    def upload_changed(self, *, closed_blocks_only: bool) -> int:
        before = self.uploads
        tail = self._run_dir / EVENTS_TAIL_FILE
        sig = _signature(tail, by_content=True)
        if sig is not None and self._uploaded.get(tail) != sig:
            self._upload(tail, sig)
        for paths in self._blocks():
            for path in paths[:-1] if closed_blocks_only else paths:
                self._upload_if_changed(path)
        records = RECORD_FILES if closed_blocks_only else RECORD_FILES + FINAL_FILES
        for name in records:
            self._upload_if_changed(self._run_dir / name)
        return self.uploads - before

    def _upload_if_changed(self, path: Path) -> None:
        sig = _signature(path)
        if sig is not None and self._uploaded.get(path) != sig:
            self._upload(path, sig)

    def upload_all(self) -> int:
        """At finish: the tail and every block (open ones included) not uploaded as they are now."""
        return self.upload_changed(closed_blocks_only=False)
