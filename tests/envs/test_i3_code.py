"""i3_code: output comparison, and scoring through a sandbox provider resolved by name.

The scoring tests use an in-test provider ("fake": plain subprocesses in a temp dir,
registered through a private plugin) so they exercise the real registry path, the real
SandboxPool and the real runner; when the ``local`` provider of telescope-sandboxes is
installed, one test also runs through it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid

import pytest

from telescope.core import hookimpl
from telescope.core.plugins import build_registry, get_plugin_manager, load_plugins
from telescope.core.registry import PluginInfo
from telescope.core.sandbox import ExecResult, SandboxConfig, SandboxHandle, SandboxProvider
from telescope.envs.i3_code_runner import outputs_match, results_match


def test_output_comparison() -> None:
    assert outputs_match("3\n", "3")
    assert outputs_match("1 2  \n3\n", "1 2\n3")
    assert outputs_match("1   2\n3", "1 2 3")  # token-wise
    assert outputs_match("0.3333", "0.333333")  # numeric within 1e-3
    assert not outputs_match("0.34", "0.333")
    assert not outputs_match("1 2", "1 2 3")
    assert not outputs_match("", "1")
    assert results_match((3, 1), [3, 1]) and results_match(9, [9]) and not results_match(8, [9])


class FakeProvider(SandboxProvider):
    """Runs commands as plain subprocesses in a private temp dir (no isolation: tests only)."""

    name = "fake"

    def __init__(self, kwargs=None) -> None:
        self.dirs: dict[str, str] = {}

    async def _create(self, config: SandboxConfig) -> SandboxHandle:
        sid = f"fake-{uuid.uuid4().hex[:8]}"
        self.dirs[sid] = tempfile.mkdtemp(prefix="i3test-")
        return SandboxHandle(sid, self.name, config)

    async def _execute(
        self, handle: SandboxHandle, command: str, timeout: float, working_dir: str | None
    ) -> ExecResult:
        cwd = os.path.join(self.dirs[handle.id], working_dir or "")
        proc = await asyncio.create_subprocess_shell(command, cwd=cwd, stdout=-1, stderr=-1)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            return ExecResult(None, "", "", timed_out=True)
        return ExecResult(proc.returncode, out.decode(), err.decode())

    async def _upload_bytes(self, handle: SandboxHandle, remote_path: str, content: bytes) -> None:
        path = os.path.join(self.dirs[handle.id], remote_path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(content)

    async def _destroy(self, handle: SandboxHandle) -> None:
        shutil.rmtree(self.dirs.pop(handle.id), ignore_errors=True)


class _FakePlugin:
    @hookimpl
    def telescope_register_sandbox_providers(self, register) -> None:
        register.add("fake", FakeProvider)


@pytest.fixture(scope="module")
def fake_registry():
    pset = get_plugin_manager(load_entrypoints=True)
    pset.pm.register(_FakePlugin(), name="fake-sandbox")
    pset.infos["fake-sandbox"] = PluginInfo("fake-sandbox", "tests", "tests", "0")
    return build_registry(pset)


SUM = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
WRONG = "```python\na, b = map(int, input().split())\nprint(a - b)\n```"
LOOP = "```python\nwhile True:\n    pass\n```"
ADD_LISTS = "```python\ndef add_lists(a, b):\n    return [x + y for x, y in zip(a, b)]\n```"
SOLUTION_CLASS = "```python\nclass Solution:\n    def maxValue(self, nums):\n        return max(nums)\n```"
DIV_MOD = "```python\ndef div_mod(a, b):\n    return divmod(a, b)\n```"


def _score_all(registry, cases: list[tuple[int, str]], **kwargs):
    env = registry.create("environment", "i3_code", {"sample_data": True, **kwargs}, registry=registry)
    samples = env.load_dataset()

    async def go():
        try:
            return [await env.score(completion, samples[i]) for i, completion in cases]
        finally:
            await env.close()

    return asyncio.run(go())


def test_scoring_through_a_named_provider(fake_registry) -> None:
    cases = [
        (0, SUM),
        (0, WRONG),
        (0, "<think>unfinished " + SUM),
        (0, "no code at all"),
        (3, ADD_LISTS),
        (4, SOLUTION_CLASS),
        (5, DIV_MOD),
        (1, "```python\nprint(input()[::-1])\n```"),
    ]
    results = _score_all(fake_registry, cases, provider="fake", pool_size=1, timeout_per_test=5)
    assert [r.total_reward for r in results] == [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    wrong = results[1].sample_metrics  # a - b is right only for "0 0"
    assert wrong["pass_rate"] == pytest.approx(1 / 3) and wrong["sandbox_error"] == 0.0
    assert results[3].info_turns[0]["info_value"] == "No code extracted"
    assert results[0].sample_metrics["num_test_cases"] == 3.0


def test_timeouts_and_partial_passes(fake_registry) -> None:
    partial = "```python\nn = input()\nprint(3)\n```"  # right only for the first test (1 2 -> 3)
    results = _score_all(
        fake_registry, [(0, LOOP), (0, partial)], provider="fake", pool_size=1, timeout_per_test=1
    )
    assert results[0].total_reward == 0.0 and results[0].sample_metrics["num_timeouts"] == 3.0
    assert results[1].total_reward == 0.0 and results[1].sample_metrics["pass_rate"] == pytest.approx(1 / 3)


def test_unknown_provider_is_refused_at_config_time(fake_registry) -> None:
    from telescope.core.config import ConfigError, load_config

    def problems(**kwargs: object) -> str:
        with pytest.raises(ConfigError) as err:
            load_config(
                None, {"environments": [{"name": "i3_code", "kwargs": kwargs}]}, registry=fake_registry
            )
        return str(err.value)

    unknown = problems(provider="lcoal")
    assert "environments[0]: kwargs.provider: unknown sandbox provider 'lcoal'" in unknown
    assert "Did you mean 'local'?" in unknown and "fake" in unknown  # the registered names
    assert "kwargs.provider_kwargs.alow_unsandboxed: unknown field" in problems(
        provider="local", provider_kwargs={"alow_unsandboxed": True}
    )
    load_config(
        None, {"environments": [{"name": "i3_code", "kwargs": {"provider": "fake"}}]}, registry=fake_registry
    )
    from telescope.core.env import create_environment

    with pytest.raises(ValueError, match="unknown sandbox provider 'nonexistent'"):
        create_environment(fake_registry, "i3_code", {"provider": "nonexistent"})


class BrokenProvider(FakeProvider):
    """Fails like a provider without credentials, at construction (inside the reward's handling)."""

    name = "broken"

    def __init__(self, kwargs=None) -> None:
        from telescope.core.sandbox import SandboxAuthError

        raise SandboxAuthError("the 'broken' sandbox provider needs credentials: set BROKEN_API_KEY")


def test_provider_failure_at_run_time_is_counted_and_logged() -> None:
    class _Plugin:
        @hookimpl
        def telescope_register_sandbox_providers(self, register) -> None:
            register.add("broken", BrokenProvider)

    pset = get_plugin_manager(load_entrypoints=True)
    pset.pm.register(_Plugin(), name="broken-sandbox")
    pset.infos["broken-sandbox"] = PluginInfo("broken-sandbox", "tests", "tests", "0")
    registry = build_registry(pset)
    (result,) = _score_all(registry, [(0, SUM)], provider="broken", max_attempts=2)
    assert result.total_reward == 0.0 and result.sample_metrics["sandbox_error"] == 1.0
    assert result.sample_metrics["retry_count"] == 1.0
    (error,) = [t["info_value"] for t in result.info_turns if t["info_key"] == "error"]
    assert "sandbox failed (broken): SandboxAuthError" in error and "BROKEN_API_KEY" in error
    env = registry.create(
        "environment", "i3_code", {"sample_data": True, "provider": "broken"}, registry=registry
    )
    with pytest.raises(Exception, match="BROKEN_API_KEY"):  # env check / run start: loud, not reward 0
        asyncio.run(env.prepare_resources())


def test_local_provider_when_installed() -> None:
    registry = load_plugins()[1]
    if not registry.has("sandbox_provider", "local"):
        pytest.skip("telescope-sandboxes does not register the 'local' provider yet")
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (run telescope-sandboxes/install-bubblewrap.sh)")
    results = _score_all(registry, [(0, SUM), (0, WRONG)], provider="local", pool_size=1, timeout_per_test=5)
    assert [r.total_reward for r in results] == [1.0, 0.0]


SUM_BODY = "a, b = map(int, input().split())\nprint(a + b)\n"


def test_response_prefix_opens_the_block_the_completion_continues(fake_registry) -> None:
    """With ``response_prefix`` the prompt ends with it, and the reward reads prefix + completion: a
    block the prefix opened counts closed or left open at the end of the turn (then it runs and an
    incomplete one fails its tests, the model's failure); without the prefix an open block is no code."""
    from transformers import AutoTokenizer

    from telescope.core.models.tiny import resolve_model_path

    fence = "```python\n"
    env = fake_registry.create(
        "environment", "i3_code", {"sample_data": True, "response_prefix": fence}, registry=fake_registry
    )
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("telescope/tiny"))
    sample = env.load_dataset()[0]
    prompt = env.format_prompt(sample, tokenizer)
    assert prompt.endswith("<|im_start|>assistant\n" + fence)
    cases = [(0, SUM_BODY + "```"), (0, SUM_BODY), (0, "a, b = map(int, inp"), (0, "print(0)\n```\ntext")]
    results = _score_all(
        fake_registry, cases, provider="fake", pool_size=1, timeout_per_test=5, response_prefix=fence
    )
    assert [r.total_reward for r in results] == [1.0, 1.0, 0.0, 0.0]
    truncated = results[2].sample_metrics  # ran: a SyntaxError fails every test, not the sandbox
    assert truncated["sandbox_error"] == 0.0 and truncated["pass_rate"] == 0.0
    assert truncated["generated_code_chars"] == len("a, b = map(int, inp")
    (plain,) = _score_all(fake_registry, [(0, fence + SUM_BODY)], provider="fake", pool_size=1)
    assert plain.total_reward == 0.0 and plain.info_turns[0]["info_value"] == "No code extracted"


def test_response_prefix_and_thinking_prefix_are_refused_together() -> None:
    from pydantic import ValidationError

    from telescope.envs.kwargs import I3CodeKwargs

    with pytest.raises(
        ValidationError, match="response_prefix and add_thinking_prefix both start the answer"
    ):
        I3CodeKwargs(response_prefix="```python\n", add_thinking_prefix=True)
