"""i3_code: code generation scored by running the task's tests in a sandbox.

The sandbox provider is resolved by name through the registry (kind ``sandbox_provider``);
``local`` (telescope-sandboxes, bubblewrap) is the default. Reward = 1 when every test
passes (stdin or function-call mode), else 0; ``pass_rate`` and timings are metrics.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from telescope.core.env import (
    RewardResult,
    Sample,
    SingleTurnEnvironment,
    info_turn,
)
from telescope.core.env.data import load_rows, select_rows
from telescope.core.env.parsers import extract_code_block, strip_think_tags
from telescope.envs.kwargs import I3CodeKwargs

if TYPE_CHECKING:
    from telescope.core.sandbox import SandboxError

__all__ = ["I3CodeEnvironment", "I3CodeKwargs", "parse_runner_output"]

RUNNER_SOURCE = (Path(__file__).resolve().parent / "i3_code_runner.py").read_text(encoding="utf-8")


def parse_runner_output(stdout: str, exit_code: int | None) -> list[dict[str, Any]] | None:
    """The runner's per-test records, or None when it failed (infrastructure error)."""
    if exit_code != 0:
        return None
    try:
        return list(json.loads(stdout.strip().splitlines()[-1])["results"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


class I3CodeEnvironment(SingleTurnEnvironment):
    """INTELLECT-3-RL code tasks (``PrimeIntellect/INTELLECT-3-RL``, subset code)."""

    kwargs_model: ClassVar[type[I3CodeKwargs]] = I3CodeKwargs  # type: ignore[assignment]
    default_name = "i3_code"
    default_instruction_prompt = "Solve the programming task below in a Python markdown code block."
    default_dataset = "PrimeIntellect/INTELLECT-3-RL"
    reward_min = 0.0
    reward_max = 1.0
    metrics_ranges: ClassVar[dict[str, dict[str, Any]]] = {
        "passed": {"min": 0.0, "max": 1.0, "invert": False},
        "pass_rate": {"min": 0.0, "max": 1.0, "invert": False},
    }

    def __init__(self, kwargs: I3CodeKwargs | None = None, *, registry: Any = None, **extra: Any) -> None:
        super().__init__(kwargs, **extra)
        self._registry = registry
        self._provider: Any = None
        self._pool: Any = None
        self._pool_lock: asyncio.Lock | None = None

    @property
    def code_kwargs(self) -> I3CodeKwargs:
        """The kwargs, typed."""
        return self.kwargs  # type: ignore[return-value]

    def load_dataset(self, num_samples: int = -1) -> list[Sample]:
        """Rows with ``info.tests`` (inputs, outputs, fn_name), filtered and subsampled."""
        from telescope.envs.sample_data import sample_path

        kw = self.code_kwargs
        rows = load_rows(
            dataset_name=kw.dataset_name or self.default_dataset,
            subset=kw.dataset_subset,
            split=kw.dataset_split or "train",
            data_files=kw.data_files,
            sample_file=sample_path("i3_code.jsonl"),
            use_sample=kw.sample_data,
        )
        rng = random.Random(kw.seed)
        samples = [s for s in (self._row_to_sample(r, rng) for r in rows) if s is not None]
        limit = num_samples if num_samples >= 0 else kw.num_samples
        self._samples = select_rows(samples, num_samples=limit, shuffle=kw.shuffle, seed=kw.seed)
        return self._samples

    def _row_to_sample(self, row: dict[str, Any], rng: random.Random) -> Sample | None:
        kw = self.code_kwargs
        if kw.difficulty_key is not None:
            level = row.get(kw.difficulty_key)
            if level is None or not kw.min_difficulty <= float(level) <= kw.max_difficulty:
                return None
        info = json.loads(row["info"]) if isinstance(row["info"], str) else row["info"]
        tests = json.loads(info["tests"]) if isinstance(info["tests"], str) else info["tests"]
        pairs = list(zip(tests["inputs"], tests["outputs"], strict=True))
        if len(pairs) > kw.max_num_tests:
            pairs = rng.sample(pairs, kw.max_num_tests)
        verification = {
            "fn_name": tests.get("fn_name") or "",
            "inputs": [p[0] for p in pairs],
            "outputs": [p[1] for p in pairs],
        }
        question = row.get("question") or row.get("prompt")
        return Sample(str(question), "", {"verification_info": verification, "num_test_cases": len(pairs)})

    def sandbox_config(self) -> Any:
        """The `SandboxConfig` of every sandbox: only what the user set (the rest is the provider's
        default, so providers that take resources from an image or template accept it)."""
        from telescope.core.sandbox import SandboxConfig

        kw = self.code_kwargs
        settings = {
            "image": kw.docker_image or None,
            "cpu": kw.cpu,
            "memory_mb": kw.memory_mb,
            "disk_size_gb": kw.disk_size_gb,
            "timeout_seconds": kw.timeout_minutes * 60,
        }
        return SandboxConfig.model_validate(
            {"name": "i3-code", **{k: v for k, v in settings.items() if v is not None}}
        )

    def _build_provider(self) -> Any:
        from telescope.core.sandbox import build_provider

        registry = self._registry
        if registry is None:
            from telescope.core.plugins import load_plugins

            registry = load_plugins()[1]
        kw = self.code_kwargs
        return build_provider(registry, kw.provider, kw.provider_kwargs)

    async def _get_pool(self) -> Any:
        from telescope.core.sandbox import SandboxPool

        if self._pool_lock is None:
            self._pool_lock = asyncio.Lock()
        async with self._pool_lock:
            if self._pool is None:
                kw = self.code_kwargs
                if self._provider is None:
                    self._provider = self._build_provider()
                config = self.sandbox_config()
                self._provider.check_config(config)
                self._pool = await SandboxPool(
                    self._provider, config, size=kw.pool_size, max_sandboxes=max(kw.pool_size, 1)
                ).start()
            return self._pool

    def format_prompt(
        self, sample: Sample, tokenizer: Any, chat: Any = None, *, add_thinking_prefix: bool | None = None
    ) -> str:
        """The chat prompt, then ``response_prefix`` (when set): the answer starts with it."""
        prompt = super().format_prompt(sample, tokenizer, chat, add_thinking_prefix=add_thinking_prefix)
        return prompt + self.code_kwargs.response_prefix

    def extract_code(self, completion: str) -> str | None:
        """The code of ``response_prefix`` + ``completion``: the last fenced block; when the prefix
        opened a block and the turn ended inside it, everything after the prefix's fence. None when
        there is none, or a ``<think>`` was never closed."""
        text = self.code_kwargs.response_prefix + completion
        if "<think>" in text and "</think>" not in text:
            return None
        text = strip_think_tags(text)
        code = extract_code_block(text)
        if code is None and self.code_kwargs.response_prefix.count("```") % 2 == 1:
            code = extract_code_block(text + "\n```")  # the block the prefix opened, left open
        return code

    async def prepare_resources(self) -> None:
        """Probe the provider (built, credentials, config accepted, one create/execute/destroy),
        then start warming the pool. Raises `SandboxError` with the provider's own message."""
        from telescope.core.sandbox import SandboxError

        if self._provider is None:
            self._provider = self._build_provider()
        async with self._provider.sandbox(self.sandbox_config()) as handle:
            result = await self._provider.execute(handle, "python3 -c 'print(6*7)'", timeout=60)
        if result.stdout.strip() != "42":
            raise SandboxError(
                f"i3_code: the '{self.code_kwargs.provider}' sandbox cannot run python3 (exit {result.exit_code}, "
                f"stderr {result.stderr.strip()[-300:]!r}); use an image with python3 (docker_image)"
            )
        await self._get_pool()

    async def close(self) -> None:
        """Destroy the pool's sandboxes."""
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def _run_tests(self, code: str, meta: dict[str, Any]) -> list[dict[str, Any]] | str | SandboxError:
        """One attempt: upload the bundle into a fresh directory, run, clean up.

        Returns the per-test records, why the sandbox failed (counted as ``sandbox_error``), or the
        infrastructure failure that hit it (``infra.infra_cause``: retried, then raised, never scored).
        """
        from telescope.core.infra import infra_cause
        from telescope.core.sandbox import SandboxError

        kw, info = self.code_kwargs, meta["verification_info"]
        bundle = {
            "mode": "func" if info["fn_name"] else "stdin",
            "code": code,
            "fn_name": info["fn_name"],
            "inputs": info["inputs"],
            "outputs": info["outputs"],
            "timeout": kw.timeout_per_test,
            "workers": kw.runner_workers,
        }
        workdir = f"run_{uuid.uuid4().hex[:12]}"
        try:  # the provider and pool are built here, so their failures are counted and logged
            pool = await self._get_pool()
            handle = await pool.acquire(timeout=600)
        except SandboxError as exc:
            return exc if infra_cause(exc) is not None else f"{type(exc).__name__}: {exc}"
        discard = True
        try:
            provider = self._provider
            await provider.upload_bytes(handle, f"{workdir}/runner.py", RUNNER_SOURCE.encode())
            await provider.upload_bytes(handle, f"{workdir}/bundle.json", json.dumps(bundle).encode())
            n = len(info["inputs"])
            timeout = max(kw.timeout_per_test * n / kw.runner_workers + 30, 60)
            result = await provider.execute(
                handle, "python3 runner.py bundle.json", timeout=timeout, working_dir=workdir
            )
            await provider.execute(handle, f"rm -rf {workdir}", timeout=30)
            discard = False
            records = parse_runner_output(result.stdout, result.exit_code)
            if records is None:
                return f"test runner failed (exit {result.exit_code}): {result.stderr.strip()[-1000:]}"
            return records
        except SandboxError as exc:
            return exc if infra_cause(exc) is not None else f"{type(exc).__name__}: {exc}"
        finally:
            await pool.release(handle, discard=discard)

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        """1.0 when the extracted code passes every test."""
        start = time.monotonic()
        text = completion  # already without the stop text (the EOS rule: Environment.strip_stop_text)
        code = self.extract_code(text)
        metrics = {
            "passed": 0.0,
            "pass_rate": 0.0,
            "sandbox_error": 0.0,
            "num_test_cases": float(sample.metadata["num_test_cases"]),
            "retry_count": 0.0,
            "generated_code_chars": float(len(code or "")),
        }
        if not code:
            return RewardResult(
                0.0, metrics, info_turns=[info_turn("error", "No code extracted", kind="stderr")]
            )
        records: list[dict[str, Any]] | str | Exception = "not run"
        for attempt in range(self.code_kwargs.max_attempts):
            metrics["retry_count"] = float(attempt)
            records = await self._run_tests(code, sample.metadata)
            if isinstance(records, list):
                break
        if isinstance(records, Exception):  # the infrastructure's failure: the sample is not scored
            raise records
        metrics["total_reward_time"] = time.monotonic() - start
        turns = [info_turn("generated_code", code, kind="code")]
        if isinstance(records, str):
            metrics["sandbox_error"] = 1.0
            error = f"sandbox failed ({self.code_kwargs.provider}): {records}"
            return RewardResult(0.0, metrics, info_turns=turns + [info_turn("error", error, kind="stderr")])
        passed = [bool(r.get("passed")) for r in records]
        metrics["pass_rate"] = sum(passed) / len(passed) if passed else 0.0
        metrics["passed"] = float(bool(passed) and all(passed))
        metrics["num_timeouts"] = float(sum(bool(r.get("timeout")) for r in records))
        failed = [r for r in records if not r.get("passed")]
        if failed:
            turns.append(info_turn("failed_tests", json.dumps(failed[:5]), kind="stderr"))
        return RewardResult(metrics["passed"], metrics, info_turns=turns)
