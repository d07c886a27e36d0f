"""On-policy distillation's signal on a fixed batch, against a hand computation from the two models.

The teacher is a real transformers-engine server (``prompt_logprobs`` over HTTP) serving a perturbed
copy of the tiny model; the reference runs both models directly with Hugging Face (teacher forcing)
and computes ``A_t = reward_weight · A + kl_coef · (teacher_t − student_t)`` on completion tokens.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from telescope.core.algorithms.distill import DistillSignal
from telescope.core.inference.settings import TransformersEngineKwargs
from telescope.core.inference.teacher import TeacherClient, TeacherError, TeacherSequence
from telescope.core.infra import infra_cause
from telescope.core.packing import pack_samples
from telescope.core.rollouts.distill import train_samples
from telescope.core.rollouts.groups import RolloutSample
from telescope.core.testing import make_config
from telescope.core.weights.group import free_port

#: (prompt, completion, loss mask, reward advantage): the second has an environment token (mask 0).
BATCH = [
    ([5, 17, 42, 99, 7], [230, 11, 64, 3], [1, 1, 1, 1], 0.75),
    ([8, 31, 2], [77, 150, 19, 45, 6], [1, 1, 0, 1, 1], -1.25),
]
KL_COEF, REWARD_WEIGHT = 0.5, 2.0


def make_cfg(**overrides: object):  # type: ignore[no-untyped-def]
    """The tiny model served in float32 on one thread (the references are float32)."""
    base = {"model": "telescope/tiny", "max_model_len": 512, "ray_inference_cpus_per_worker": 1.0}
    return make_config(**{**base, "inference_dtype": "float32", **overrides})


@pytest.fixture(scope="module")
def teacher(tiny_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """The tiny model with every weight perturbed (another policy, the same tokenizer), served."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from telescope.core.inference.transformers_engine.server import start_in_thread

    folder = tmp_path_factory.mktemp("teacher")
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_path).save_pretrained(folder)
    srv = start_in_thread(
        make_cfg(model=str(folder)), TransformersEngineKwargs(max_num_seqs=8), port=free_port()
    )
    yield SimpleNamespace(url=srv.url, path=str(folder))
    srv.stop()


def forced_logprobs(path: str, prompt: list[int], completion: list[int]) -> list[float]:
    """log p(completion_t | prompt, completion_<t) of the model at ``path``, by Hugging Face directly."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0]
    logp = torch.log_softmax(logits.float(), dim=-1)[len(prompt) - 1 : -1]
    return logp.gather(1, torch.tensor(completion)[:, None])[:, 0].tolist()


def test_advantage_is_the_hand_computed_reverse_kl_of_the_sampled_completion_tokens(
    teacher: SimpleNamespace, tiny_path: str
) -> None:
    student = [forced_logprobs(tiny_path, p, c) for p, c, _, _ in BATCH]
    expected_teacher = [forced_logprobs(teacher.path, p, c) for p, c, _, _ in BATCH]

    async def score() -> list[list[float]]:
        from telescope.core.cluster.run_secret import auth_headers

        client = TeacherClient([teacher.url], "teacher", batch_size=8, headers=auth_headers())
        try:
            return await client.score([TeacherSequence(p, c) for p, c, _, _ in BATCH])
        finally:
            await client.close()

    scored = asyncio.run(score())
    samples = [
        RolloutSample(p, c, s, m, "stop", 0.0, 0.0, advantage=a, teacher_logprobs=[t])
        for (p, c, m, a), s, t in zip(BATCH, student, scored, strict=True)
    ]
    train, metrics = train_samples(samples, DistillSignal(kl_coef=KL_COEF, reward_weight=REWARD_WEIGHT))
    row = pack_samples(train, seq_len=64, pad_to_multiple_of=8).per_rank[0][0]

    kl_sum = kl_tokens = teacher_sum = 0.0
    for k, ((prompt, completion, mask, adv), s, t) in enumerate(
        zip(BATCH, student, expected_teacher, strict=True)
    ):
        positions = [i for i, idx in enumerate(row.sample_index) if idx == k][len(prompt) :]
        assert [row.input_ids[i] for i in positions] == completion
        for i, s_t, t_t, m in zip(positions, s, t, mask, strict=True):
            expected = REWARD_WEIGHT * adv + (KL_COEF * (t_t - s_t) if m else 0.0)
            assert row.advantages[i] == pytest.approx(expected, abs=1e-4)
            if m:
                kl_sum, kl_tokens, teacher_sum = kl_sum + s_t - t_t, kl_tokens + 1, teacher_sum + t_t
        assert any(abs(t_t - s_t) > 1e-2 for t_t, s_t in zip(t, s, strict=True))  # the models differ
    assert metrics["distill/reverse_kl"] == pytest.approx(kl_sum / kl_tokens, abs=1e-4)
    assert metrics["distill/teacher_logprob_mean"] == pytest.approx(teacher_sum / kl_tokens, abs=1e-4)


def test_prompt_logprobs_match_teacher_forcing_with_ranks_and_alternatives(teacher: SimpleNamespace) -> None:
    import aiohttp

    from telescope.core.cluster.run_secret import auth_headers

    prompt = [5, 17, 42, 99, 7, 230]

    async def ask() -> dict:
        body = {"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 2}
        async with aiohttp.ClientSession(headers=auth_headers()) as http:
            async with http.post(teacher.url + "/v1/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                return await resp.json()

    rows = asyncio.run(ask())["choices"][0]["prompt_logprobs"]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(teacher.path, dtype=torch.float32).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt])).logits[0].float(), dim=-1)
    assert rows[0] is None and len(rows) == len(prompt)
    for t in range(1, len(prompt)):
        row = {int(k): v for k, v in rows[t].items()}
        expected = logp[t - 1]
        assert row[prompt[t]]["logprob"] == pytest.approx(float(expected[prompt[t]]), abs=1e-4)
        assert row[prompt[t]]["rank"] == int((expected > expected[prompt[t]]).sum()) + 1
        best = expected.topk(2).indices.tolist()
        assert set(best) <= set(row) and row[best[0]]["rank"] == 1


def test_telescope_serve_gateway_is_a_teacher_with_its_api_key(
    teacher: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway passes ``prompt_logprobs`` through: scoring through it gives the server's values."""
    from transformers import AutoTokenizer

    from telescope.core.cluster.run_secret import auth_headers
    from telescope.core.inference.client import InferenceClient
    from telescope.core.inference.gateway.app import Gateway, GatewaySettings
    from telescope.core.inference.gateway.serve import GatewayThread
    from telescope.core.inference.teacher import API_KEY_ENV

    tokenizer = AutoTokenizer.from_pretrained(teacher.path)
    settings = GatewaySettings(served_model_name="teacher", max_model_len=512, max_tokens=4)
    gateway = GatewayThread(lambda: Gateway(InferenceClient(teacher.url), tokenizer, settings, secret="k3y"))
    sequences = [TeacherSequence(p, c) for p, c, _, _ in BATCH]

    async def score(client: TeacherClient) -> list[list[float]]:
        try:
            return await client.score(sequences)
        finally:
            await client.close()

    try:
        monkeypatch.setenv(API_KEY_ENV, "k3y")
        through_gateway = asyncio.run(score(TeacherClient.remote(gateway.url, "teacher", max_retries=0)))
        monkeypatch.setenv(API_KEY_ENV, "wrong")
        with pytest.raises(TeacherError, match="HTTP 401") as refused:
            asyncio.run(score(TeacherClient.remote(gateway.url, "teacher", max_retries=0)))
        assert infra_cause(refused.value) is None  # a wrong key is the setup's, not the infrastructure's
    finally:
        gateway.stop()
    direct = asyncio.run(score(TeacherClient([teacher.url], "teacher", headers=auth_headers())))
    for gateway_values, direct_values in zip(through_gateway, direct, strict=True):
        assert gateway_values == pytest.approx(direct_values, abs=1e-6)


def test_a_failing_teacher_is_retried_counted_and_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """After its retries an unreachable teacher is an infrastructure failure of the samples it was to
    score (teacher_error: each retried, then masked, as any other), counted once for the request."""
    from telescope.core.inference import teacher as teacher_module
    from telescope.core.infra import ORIGINS

    monkeypatch.setattr(teacher_module, "RETRY_BASE_S", 0.01)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: every attempt fails
    raised: list[BaseException] = []

    async def score() -> TeacherClient:
        client = TeacherClient([url], "teacher", timeout_s=2.0, max_retries=2)
        try:
            with pytest.raises(TeacherError, match="after 3 attempt") as failed:
                await client.score([TeacherSequence([1, 2], [3, 4]), TeacherSequence([1], [5])])
            raised.append(failed.value)
        finally:
            await client.close()
        return client

    ORIGINS.drain()
    counts = asyncio.run(score()).counts
    assert (counts.requests, counts.retries, counts.failures) == (3, 2, 2)
    cause = infra_cause(raised[0])
    assert cause is not None and (cause.cause, cause.provider) == ("teacher_error", "teacher")
    assert {(o.cause, o.provider): n for o, n in ORIGINS.drain().items()} == {("teacher_error", "teacher"): 1}


def test_a_sample_without_teacher_logprobs_is_refused_not_trained_with_zero() -> None:
    sample = RolloutSample([1, 2], [3], [-0.5], None, "stop", 1.0, 1.0, advantage=1.0)
    with pytest.raises(ValueError, match="teacher logprobs for none"):
        train_samples([sample], DistillSignal(kl_coef=1.0, reward_weight=1.0))


def test_a_teacher_with_another_vocabulary_is_refused_naming_both(tiny_path: str, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from telescope.core.runtime.teacher import check_same_tokenizer

    other = AutoTokenizer.from_pretrained(tiny_path)
    other.add_tokens(["<teacher-only>"])
    other.save_pretrained(tmp_path)
    cfg = make_cfg(model=tiny_path, distill_teacher_model=str(tmp_path), discard_group_zero_advantage=False)
    check_same_tokenizer(
        cfg.model_copy(update={"distill_teacher_model": tiny_path}), AutoTokenizer.from_pretrained(tiny_path)
    )
    with pytest.raises(ValueError, match="another tokenizer") as err:
        check_same_tokenizer(cfg, AutoTokenizer.from_pretrained(tiny_path))
    assert str(tmp_path) in str(err.value) and tiny_path in str(err.value)


def _config(**fields: object):  # type: ignore[no-untyped-def]
    from telescope.core.config import load_config
    from telescope.core.plugins import load_plugins

    base = {"environments": [{"name": "reverse_text"}], "discard_group_zero_advantage": False}
    return load_config(None, {**base, **fields}, load_plugins()[1])


@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "reinforce_pp", "dr_grpo", "cispo", "sapo"])
def test_per_token_algorithms_take_a_teacher(algorithm: str) -> None:
    assert _config(algorithm=algorithm, distill_teacher_model="t").distill_teacher_model == "t"


def test_what_cannot_distill_is_refused_at_start_up_naming_the_fix() -> None:
    from telescope.core.algorithms import get_algorithm
    from telescope.core.config import ConfigError
    from telescope.core.rollouts.batching import BatchBuilder

    with pytest.raises(ConfigError, match="algorithm 'gspo' uses one advantage per sequence"):
        _config(algorithm="gspo", distill_teacher_model="t")
    with pytest.raises(ConfigError, match="set discard_group_zero_advantage: false"):
        _config(distill_teacher_model="t", discard_group_zero_advantage=True)
    with pytest.raises(ConfigError, match="distill_teacher_base_url: http://x:1 needs distill_teacher_model"):
        _config(distill_teacher_base_url="http://x:1")
    with pytest.raises(ConfigError, match="leave no training signal"):
        _config(distill_teacher_model="t", distill_kl_coef=0.0, distill_reward_weight=0.0)
    cfg = _config(distill_teacher_model="t")  # a plugin's algorithm is checked when the batches are built
    with pytest.raises(ValueError, match="not supported by algorithm 'gspo'"):
        BatchBuilder(cfg, get_algorithm("gspo"), pad_token_id=0)
