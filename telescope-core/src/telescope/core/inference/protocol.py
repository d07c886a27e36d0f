"""The wire protocol every Telescope inference server speaks (no heavy imports).

Completions follow OpenAI's ``/v1/completions`` with vLLM's extensions (token-id prompts,
``return_token_ids``, ``stop_token_ids``, ``priority``, ``request_id``), so the orchestrator
talks to the ``transformers`` and ``vllm`` engines through one client. Control endpoints use
vLLM's paths where vLLM has one (``/abort_requests``, ``/pause``, ``/resume``, ``/is_paused``,
``/health``, ``/metrics``); weight sync lives under ``/telescope/weights/*`` on both engines.

A choice's ``logprobs.token_logprobs[i]`` is the logprob of ``token_ids[i]`` under the
temperature-scaled distribution, before any top-p renormalisation (the trainer's definition).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "ENDPOINTS",
    "MAX_TOP_LOGPROBS",
    "AbortRequest",
    "CompletionChoice",
    "CompletionRequest",
    "CompletionResponse",
    "ChoiceLogprobs",
    "Usage",
    "WeightSyncInitRequest",
    "WeightUpdateRequest",
    "WeightUpdateResponse",
]

#: Paths of the shared protocol.
ENDPOINTS = {
    "completions": "/v1/completions",
    "models": "/v1/models",
    "health": "/health",
    "metrics": "/metrics",
    "abort": "/abort_requests",
    "pause": "/pause",
    "resume": "/resume",
    "is_paused": "/is_paused",
    "weights_init": "/telescope/weights/init",
    "weights_update": "/telescope/weights/update",
    "weights_version": "/telescope/weights/version",
}

TokenPrompt = list[int]

#: Name of a weight-sync group the driver drew (``weights.settings.new_group_name``).
GROUP_NAME = re.compile(r"telescope-weights-[0-9a-f]{32}")

#: Largest ``n`` a request may ask for (a GRPO group is rarely above 64; 10^6 once queued a million sequences).
MAX_N = 1024
#: Most alternatives a request may ask per token (``logprobs: k``; vLLM's default ``max_logprobs``).
MAX_TOP_LOGPROBS = 20
#: Largest seed: seeds are 64-bit and a request's choices use ``seed + choice_index``.
MAX_SEED = 2**63 - 1


class CompletionRequest(BaseModel):
    """Body of ``POST /v1/completions`` (the fields both engines honour)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    prompt: TokenPrompt | list[TokenPrompt] | str | list[str]
    """Token ids (preferred: no re-tokenization drift), a list of them, text, or a list of texts."""
    model: str | None = None
    """Served model name (informational; each server serves one model)."""
    n: int = Field(default=1, ge=1, le=MAX_N)
    """Samples per prompt (at most ``MAX_N``)."""
    temperature: float = Field(default=1.0, ge=0)
    """Sampling temperature; 0 = greedy."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """Nucleus sampling mass; null or 1 = disabled."""
    max_tokens: int = Field(default=16, ge=1)
    """Maximum completion tokens per sample."""
    stop_token_ids: list[int] | None = None
    """Token ids that end a sample (the stop token is kept in ``token_ids``)."""
    stop: str | list[str] | None = None
    """Stop strings: a sample ends with the token that completes one (the token is kept in
    ``token_ids``; ``text`` is cut before the string on vLLM, whole on the transformers engine)."""
    ignore_eos: bool = False
    """Keep generating past the model's end-of-sequence token."""
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    """Return the sampled tokens' logprobs (0 = just those; k > 0 also the k most likely alternatives
    per token in ``top_logprobs``, at most ``MAX_TOP_LOGPROBS``)."""
    priority: int = 0
    """Lower is scheduled earlier (needs vllm_scheduling_policy: priority when non-zero)."""
    request_id: str | None = None
    """Caller-chosen id, so the request can be aborted; a random one otherwise."""
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED)
    """Per-request sampling seed (0 to 2^63 - 1; choice i samples with ``seed + i``)."""
    return_token_ids: bool = True
    """Return ``token_ids`` and ``prompt_token_ids`` in each choice (always on for Telescope)."""
    return_tokens_as_token_ids: bool = False
    """Render logprob tokens as ``token_id:<id>`` (vLLM's option; accepted by both engines)."""
    skip_special_tokens: bool = True
    """Leave special tokens out of ``text``."""
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    """vLLM's extension: each choice's ``prompt_logprobs`` gives, for every prompt token after the first,
    ``{"<id>": {"logprob", "rank"}}`` of that token (and its ``prompt_logprobs`` most likely alternatives)
    under the model's own distribution (temperature 1); the first entry is null. A teacher's judgement
    of given token ids (on-policy distillation)."""
    cache_salt: str | None = None
    """vLLM's prefix-cache namespace: requests reuse only cached blocks made under the same salt (the
    vllm client names the weights with it). The transformers engine has no prefix cache: ignored."""


class ChoiceLogprobs(BaseModel):
    """OpenAI completions logprobs block."""

    model_config = ConfigDict(extra="allow")

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] | None = None
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    """One sample."""

    model_config = ConfigDict(extra="allow")

    index: int
    text: str = ""
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort"] | str | None = None
    weight_versions: list[int] | None = None
    """Telescope extension: the weight versions that produced this sample (first to last)."""
    prompt_logprobs: list[dict[str, dict[str, float | int | str | None]] | None] | None = None
    """vLLM's ``prompt_logprobs`` (requests that ask for them): null, then per prompt token
    ``{"<id>": {"logprob": ..., "rank": ...}}``."""


class Usage(BaseModel):
    """Token counts."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionResponse(BaseModel):
    """Body of a ``/v1/completions`` response."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: str = "text_completion"
    created: int = 0
    model: str = ""
    choices: list[CompletionChoice]
    usage: Usage = Field(default_factory=Usage)


class AbortRequest(BaseModel):
    """Body of ``POST /abort_requests``: the ids to abort (empty or missing = all)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    request_ids: list[str] | None = None
    """Request ids given in ``request_id`` of the completions."""


class WeightSyncInitRequest(BaseModel):
    """Body of ``POST /telescope/weights/init``: join the trainer's weight-sync group."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    host: str
    """Store address hosted by trainer rank 0."""
    port: int = Field(ge=1, le=65535)
    """Store port."""
    world_size: int = Field(ge=2)
    """1 trainer + all receiving workers."""
    rank: int = Field(ge=1)
    """This server's first rank (its TP workers take rank .. rank + tp - 1)."""
    backend: Literal["gloo", "nccl"] = "gloo"
    """gloo (CPU) or nccl (GPU)."""
    group_name: str = Field(default="", validate_default=True)
    """Store key prefix of the group: ``telescope-weights-<nonce>``, a name the driver draws for each group
    (``weights.settings.new_group_name``). A server joins no group without one: whoever merely reaches
    the store's port cannot guess the keys of its rendezvous."""
    timeout_s: float = Field(default=300.0, gt=0)
    """Rendezvous and per-collective timeout (ray_broadcast_init_timeout_s)."""

    @field_validator("group_name")
    @classmethod
    def _announced(cls, name: str) -> str:
        if not GROUP_NAME.fullmatch(name):
            raise ValueError(
                f"group_name {name!r} carries no nonce: a server joins only a group the driver named "
                "telescope-weights-<32 hex digits> (telescope.core.weights.settings.new_group_name); send "
                "the name the trainer's rank 0 was given"
            )
        return name


class WeightUpdateRequest(BaseModel):
    """Body of ``POST /telescope/weights/update``: receive the next sync and load it."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    version: int = Field(ge=0)
    """The version the trainer is about to send (checked against the stream's own header)."""
    apply: bool = True
    """Load the received weights. False: take part in the broadcast and verify the transport, but keep
    serving the current weights and weight version (eval servers held at an eval step's weights)."""


class WeightUpdateResponse(BaseModel):
    """What the server loaded."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    version: int
    """Weight version now served (with ``applied`` false: the version served before the sync)."""
    received_version: int | None = None
    """Version the trainer sent in this sync (equals ``version`` when applied)."""
    applied: bool = True
    """Whether the received weights were loaded (false for a request with ``apply`` false)."""
    num_tensors: int
    """Tensors received."""
    seconds: float
    """Receive + load time on the server."""
    load_seconds: float | None = None
    """Of ``seconds``, the time spent loading, the wait for the trainer's tensors and their receipt left
    out (the transformers engine: the swap between two decode steps; vLLM: its slowest worker's load);
    None for a sync that was not applied."""
    reload: str | None = None
    """How the server loaded the weights (vLLM: ``staged``, in place with its own weight loaders;
    ``layerwise``, its layer-wise reload; ``adapter``, a LoRA adapter); None where not reported."""
    repacked_tensors: int | None = None
    """vLLM's staged reload: parameters loaded into a checkpoint-form staging tensor and re-packed for
    their kernels (vLLM's CPU build with ``cpu_weight_prepack``: every linear weight; 0 where the
    kernels read the weights as loaded, as on GPUs); None for other loads."""
    fingerprints: dict[str, str] | None = None
    """Fingerprints of the model's tensors after loading, or with ``applied`` false of the tensors received
    (null without verification)."""
