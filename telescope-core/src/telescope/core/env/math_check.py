"""Math answer checking with math-verify, safe off the main thread.

math-verify enforces its timeouts with ``signal.alarm``, which only works on a process's
main thread (and raises anywhere else). Rewards run in threads and event loops, so every
check runs in a small pool of worker *processes*: there math-verify keeps its own timeouts
(the worker runs tasks on its main thread), and a hard outer deadline kills a stuck worker.
"""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool

from telescope.core.env.parsers import verify_exact_match

__all__ = ["MAX_ANSWER_CHARS", "MathVerifier", "MathVerifyTimeout", "verify_math_answer"]

#: Longer predictions are wrong by definition (they are never a final answer, and huge
#: inputs are how parsers get stuck).
MAX_ANSWER_CHARS = 500


class MathVerifyTimeout(TimeoutError):
    """math-verify did not finish within its deadline (the worker was killed)."""


def _verify_in_worker(prediction: str, ground_truth: str, timeout_s: int) -> bool:
    """Runs in a worker process, on its main thread, so math-verify's alarms work."""
    try:
        import math_verify

        gold = math_verify.parse(f"\\boxed{{{ground_truth}}}", parsing_timeout=timeout_s)
        pred = math_verify.parse(f"\\boxed{{{prediction}}}", parsing_timeout=timeout_s)
        if not gold or not pred:
            return verify_exact_match(prediction, ground_truth)
        return bool(math_verify.verify(gold, pred, timeout_seconds=timeout_s))
    except Exception:  # noqa: BLE001 - any parser failure falls back to exact match
        return verify_exact_match(prediction, ground_truth)


def _warm_worker() -> bool:
    import math_verify  # noqa: F401 - imports sympy & co. once per worker

    return True


class MathVerifier:
    """A pool of math-verify worker processes with a hard per-check deadline.

    Args:
        workers: worker processes (each holds sympy, ~100 MB).
        timeout_s: math-verify's own parse/verify timeout inside the worker (seconds).
        hard_timeout_s: outer deadline per check; past it the pool is killed and rebuilt.
    """

    def __init__(self, *, workers: int = 2, timeout_s: int = 5, hard_timeout_s: float = 20.0) -> None:
        if workers < 1:
            raise ValueError(f"MathVerifier workers must be >= 1, got {workers}")
        self.workers = workers
        self.timeout_s = timeout_s
        self.hard_timeout_s = hard_timeout_s
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def _get_pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                # spawn: forking a process that runs threads / event loops can deadlock.
                ctx = multiprocessing.get_context("spawn")
                self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx)
            return self._pool

    def _kill_pool(self, pool: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = None
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def warmup(self) -> None:
        """Start the workers and import math-verify in each (optional; first use does it)."""
        pool = self._get_pool()
        for fut in [pool.submit(_warm_worker) for _ in range(self.workers)]:
            fut.result(timeout=120)

    def verify(self, prediction: str, ground_truth: str) -> bool:
        """True when ``prediction`` is mathematically equal to ``ground_truth``.

        Empty or over-long predictions are False without a check. Raises
        ``MathVerifyTimeout`` when the hard deadline passes.
        """
        prediction, ground_truth = str(prediction).strip(), str(ground_truth).strip()
        if not prediction or len(prediction) > MAX_ANSWER_CHARS:
            return False
        for attempt in range(2):
            pool = self._get_pool()
            try:
                fut = pool.submit(_verify_in_worker, prediction, ground_truth, self.timeout_s)
                return bool(fut.result(timeout=self.hard_timeout_s))
            except FutureTimeout:
                self._kill_pool(pool)
                raise MathVerifyTimeout(
                    f"math-verify took longer than {self.hard_timeout_s}s on a "
                    f"{len(prediction)}-char answer; the worker was killed"
                ) from None
            except BrokenProcessPool:
                # Another check killed the pool under us: rebuild once.
                self._kill_pool(pool)
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Stop the worker processes."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


_shared: MathVerifier | None = None
_shared_lock = threading.Lock()


def shared_verifier() -> MathVerifier:
    """The process-wide verifier (worker processes are costly: share one pool)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = MathVerifier()
        return _shared


def verify_math_answer(prediction: str, ground_truth: str) -> bool:
    """Check ``prediction`` against ``ground_truth`` with math-verify (safe from any thread).

    Falls back to whitespace-normalised exact match when math-verify cannot parse either
    side. Raises ``MathVerifyTimeout`` past the hard deadline (a Rubric scores that 0 and
    records ``reward_timeout``).
    """
    return shared_verifier().verify(prediction, ground_truth)
