"""``GenerationEngine``: continuous batching over a Hugging Face causal LM, in one loop thread.

Each loop iteration, in order: apply a pending weight update (so updates land *between*
decode steps, never inside one), drop aborted sequences, admit waiting sequences up to
``max_num_seqs`` (one batched prefill, which samples their first token), then one batched
decode step for every running sequence. Llama-family models prefill and decode through
``decoder.SlotDecoder``; others through the Hugging Face forward. torch releases the GIL inside kernels, so the HTTP
event loop stays responsive while the loop thread computes.

A prompt is prefilled once while any sequence with it runs (and the weights did not change
since): sequences with the same prompt (a GRPO group: ``n`` samples of one request, or one
request per sample arriving a few milliseconds apart) get copies of its keys/values and last
logits, then sample on their own. The held prompt (copies of its rows of the prefill) is
released with its last sequence. Only the last position's logits are computed
(``logits_to_keep``) where the model supports it.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from telescope.core.inference.transformers_engine.decoder import SlotDecoder, supports
from telescope.core.inference.transformers_engine.kv import KV, BatchCache, PaddedBatch
from telescope.core.inference.transformers_engine.sampling import sample_next, top_logprobs
from telescope.core.inference.transformers_engine.scheduler import RequestState, Sequence, WaitQueue

__all__ = ["EngineOptions", "GenerationEngine"]

PromptKey = tuple[int, tuple[int, ...]]
"""(``GenerationEngine.epoch``, prompt ids): keys/values of a prompt are valid only for the weights
that computed them, and weights change only in a call run between steps (a weight swap)."""


@dataclass
class SharedPrompt:
    """A prefilled prompt: its keys/values [1, heads, len, dim] per layer, last logits [vocab], users."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    logits: torch.Tensor
    users: int = 0


@dataclass(frozen=True)
class EngineOptions:
    """What the loop needs from the resolved config and the engine kwargs."""

    max_num_seqs: int
    max_model_len: int
    scheduling_policy: str
    seed: int
    eos_token_ids: frozenset[int]
    simulated_decode_step_s: float = 0.0
    slot_decoder: bool = True
    """Decode with ``decoder.SlotDecoder`` where the architecture allows (False: always the Hugging
    Face forward over a padded cache; tests compare the two)."""


class GenerationEngine:
    """Batched generation with a KV cache; thread-safe ``submit``/``abort``/``pause``/``run_between_steps``."""

    def __init__(
        self, model: Any, options: EngineOptions, detokenize: Callable[[list[int]], str] | None = None
    ) -> None:
        self.model = model.eval()
        self.detokenize = detokenize
        """Token ids -> text, for stop strings (a sample with stop strings needs it)."""
        self._cache_kwarg = cache_kwarg(model)
        # Sampling needs the last position only: the LM head over a whole prompt is wasted work.
        self._last_logits = {"logits_to_keep": 1} if accepts(model, "logits_to_keep") else {}
        self.options = options
        self.device = next(model.parameters()).device
        self.queue = WaitQueue(options.scheduling_policy)
        self.running: list[Sequence] = []
        self.batch: SlotDecoder | PaddedBatch = (
            SlotDecoder(model, options.max_num_seqs, options.max_model_len)
            if options.slot_decoder and supports(model)
            else PaddedBatch(self._forward, self.device)
        )
        """The running rows' keys/values, in ``running``'s order, and the decode step over them."""
        self.next_tokens = torch.empty(0, dtype=torch.long, device=self.device)
        self.weight_version = 0
        # prompt_tokens: every admitted prompt's tokens; prompt_tokens_computed: those the model
        # computed (the others were copied from the same prompt held for a running sequence).
        self.counters: dict[str, int] = {
            "prompt_tokens": 0,
            "generation_tokens": 0,
            "decode_steps": 0,
            "decode_rows": 0,
            "prefill_batches": 0,
            "sequences_finished": 0,
            "sequences_aborted": 0,
            "max_running": 0,
            "prompt_tokens_computed": 0,
        }
        self._generator = torch.Generator().manual_seed(options.seed)
        self._seq_generators: dict[int, torch.Generator] = {}
        self._prompts: dict[PromptKey, SharedPrompt] = {}
        self.epoch = 0
        """Calls run between steps so far (any of them may have changed the weights)."""
        self._seq_prompt: dict[int, PromptKey] = {}
        self._requests: dict[str, RequestState] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._calls: list[tuple[Callable[[], Any], dict[str, Any]]] = []
        self._paused = False
        self._draining = False
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="telescope-generation", daemon=True)
        self._thread.start()

    # --- thread-safe API ----------------------------------------------------------------
    def submit(self, request: RequestState) -> None:
        """Queue every sequence of ``request``."""
        request._remaining = len(request.sequences)
        with self._lock:
            self._requests[request.request_id] = request
        self.queue.push_request(request)
        self._wake.set()

    def abort(self, request_ids: list[str] | None) -> int:
        """Abort the named requests (all when ``None``); returns how many were found."""
        with self._lock:
            targets = (
                list(self._requests.values())
                if request_ids is None
                else [self._requests[r] for r in request_ids if r in self._requests]
            )
            for request in targets:
                request.aborted = True
        for request in targets:
            for seq in self.queue.remove_request(request):
                request.finish(seq, "abort")
        self._wake.set()
        return len(targets)

    def pause(self, mode: str = "keep") -> None:
        """keep: freeze running sequences; wait: finish running ones, admit none; abort: abort all.

        Blocks until the loop is between two steps, so no decode step runs after it returns.
        """
        if mode not in ("keep", "wait", "abort"):
            raise ValueError(f"unknown pause mode {mode!r}; use keep, wait or abort")
        if mode == "abort":
            self.abort(None)

        def set_flags() -> None:  # on the loop thread: once this returns, no decode step runs
            self._draining = mode == "wait"
            self._paused = mode != "wait"

        self.run_between_steps(set_flags, timeout=600)

    def resume(self) -> None:
        """Resume scheduling."""
        with self._lock:
            self._paused = self._draining = False
        self._wake.set()

    def is_active(self, request_id: str) -> bool:
        """True while ``request_id`` has unfinished sequences."""
        with self._lock:
            return request_id in self._requests

    @property
    def alive(self) -> bool:
        """True while the loop thread runs."""
        return self._thread.is_alive() and not self._stopped

    @property
    def is_paused(self) -> bool:
        """True while paused (or draining before a pause)."""
        return self._paused or self._draining

    def run_between_steps(self, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        """Run ``fn`` on the loop thread between two decode steps and return its result."""
        box: dict[str, Any] = {"done": threading.Event()}
        with self._lock:
            self._calls.append((fn, box))
        self._wake.set()
        if not box["done"].wait(timeout):
            raise TimeoutError(f"the generation loop did not reach a step boundary within {timeout}s")
        if "error" in box:
            raise box["error"]
        return box.get("result")

    def stats(self) -> dict[str, float]:
        """Gauges and counters for ``/metrics``."""
        tokens = self.batch.tokens
        capacity = self.options.max_num_seqs * self.options.max_model_len
        return {
            "num_requests_running": len(self.running),
            "num_requests_waiting": len(self.queue),
            "kv_cache_usage_perc": tokens / capacity,
            "weight_version": self.weight_version,
            **{f"{k}_total" if k != "max_running" else k: v for k, v in self.counters.items()},
        }

    def stop(self) -> None:
        """Stop the loop thread (aborting whatever is left)."""
        self.abort(None)
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=10)

    # --- loop thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        with torch.inference_mode():
            while not self._stopped:
                self._run_calls()
                self._drop_aborted()
                if self._paused or not (self.running or (len(self.queue) and not self._draining)):
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                if not self._draining:
                    self._admit()
                if self.running:
                    self._decode_step()
                elif self._draining:
                    with self._lock:
                        self._draining, self._paused = False, True

    def _run_calls(self) -> None:
        with self._lock:
            calls, self._calls = self._calls, []
        if calls:  # a held prompt is not reused past a call that may have swapped the weights
            self.epoch += 1
        for fn, box in calls:
            try:
                box["result"] = fn()
            except BaseException as exc:  # noqa: BLE001 (re-raised in the caller thread)
                box["error"] = exc
            box["done"].set()

    def _drop_aborted(self) -> None:
        keep = [i for i, s in enumerate(self.running) if not s.request.aborted]
        if len(keep) == len(self.running):
            return
        aborted = [(s, "abort") for s in self.running if s.request.aborted]
        self._keep_rows(keep)
        self._finish_all(aborted)

    def _keep_rows(self, keep: list[int]) -> None:
        self.running = [self.running[i] for i in keep]
        self.batch.keep(keep)
        if self.running:
            self.next_tokens = self.next_tokens[torch.tensor(keep, dtype=torch.long, device=self.device)]
        else:
            self.next_tokens = self.next_tokens[:0]

    def _finish(self, seq: Sequence, reason: str) -> None:
        self._seq_generators.pop(id(seq), None)
        key = self._seq_prompt.pop(id(seq), None)
        if key is not None:
            shared = self._prompts[key]
            shared.users -= 1
            if shared.users == 0:
                del self._prompts[key]
        self.counters["sequences_aborted" if reason == "abort" else "sequences_finished"] += 1
        seq.request.finish(seq, reason)
        with self._lock:
            if all(s.finish_reason is not None for s in seq.request.sequences):
                self._requests.pop(seq.request.request_id, None)

    def _admit(self) -> None:
        free = self.options.max_num_seqs - len(self.running)
        new = self.queue.pop(free) if free > 0 else []
        if not new:
            return
        for seq in new:
            seq.weight_versions.append(self.weight_version)
            if seq.params.seed is not None:
                self._seq_generators[id(seq)] = torch.Generator().manual_seed(
                    seq.params.seed + seq.choice_index
                )
        prompts, logits = self._prefill(new)
        tokens, logprobs, tops = self._sample(new, logits)
        keep, finished = self._record(new, tokens, logprobs, tops)
        if keep:
            self.batch.add([prompts[i] for i in keep])  # each row extends its own copy
            self.next_tokens = torch.cat([self.next_tokens, tokens[torch.tensor(keep, device=self.device)]])
            self.running.extend(new[i] for i in keep)
        self.counters["max_running"] = max(self.counters["max_running"], len(self.running))
        self._finish_all(finished)

    def _prefill(self, new: list[Sequence]) -> tuple[list[KV], torch.Tensor]:
        """Keys/values and last logits per sequence of ``new``; prompts not held are computed."""
        keys: list[PromptKey] = [(self.epoch, tuple(seq.prompt_ids)) for seq in new]
        missing = [key for key in dict.fromkeys(keys) if key not in self._prompts]
        if missing:
            self._compute_prompts(missing)
        self.counters["prefill_batches"] += 1
        self.counters["prompt_tokens"] += sum(len(key[1]) for key in keys)
        for seq, key in zip(new, keys, strict=True):
            self._prompts[key].users += 1
            self._seq_prompt[id(seq)] = key
        shared = [self._prompts[key] for key in keys]
        return [p.layers for p in shared], torch.stack([p.logits for p in shared])

    def _compute_prompts(self, keys: list[PromptKey]) -> None:
        """One forward over the prompts of ``keys``; each is held in ``_prompts`` (no users yet)."""
        prompts = [key[1] for key in keys]
        self.counters["prompt_tokens_computed"] += sum(len(p) for p in prompts)
        if isinstance(self.batch, SlotDecoder):  # the lean forward: no 4D mask, cache objects or outputs
            layers, logits = self.batch.prefill([list(p) for p in prompts])
            for key, kv, row_logits in zip(keys, layers, logits, strict=True):
                self._prompts[key] = SharedPrompt(kv, row_logits)
            return
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        fresh = BatchCache([], mask)
        logits = self._forward(ids, mask, (mask.cumsum(1) - 1).clamp_(min=0), fresh)
        for row, (key, prompt) in enumerate(zip(keys, prompts, strict=True)):
            start = width - len(prompt)
            # copies, not views: a view would keep the whole padded prefill batch (and, for a model
            # without logits_to_keep, its full logits) alive until the batch's last sequence ends
            self._prompts[key] = SharedPrompt(
                [
                    (k[row : row + 1, :, start:].clone(), v[row : row + 1, :, start:].clone())
                    for k, v in fresh.layers
                ],
                logits[row].clone(),
            )

    def _decode_step(self) -> None:
        logits = self.batch.step(self.next_tokens)
        if self.options.simulated_decode_step_s:
            time.sleep(self.options.simulated_decode_step_s)  # off the GIL, like waiting on a GPU
        self.counters["decode_steps"] += 1
        self.counters["decode_rows"] += len(self.running)
        tokens, logprobs, tops = self._sample(self.running, logits)
        keep, finished = self._record(self.running, tokens, logprobs, tops)
        self.next_tokens = tokens
        if len(keep) != len(self.running):
            self._keep_rows(keep)
        self._finish_all(finished)  # after the batch shrank, so stats never count finished rows

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: BatchCache
    ) -> torch.Tensor:
        """Run the model over ``ids`` with ``cache``; ``cache`` absorbs the new keys/values."""
        dynamic = cache.as_dynamic_cache(self.model.config)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{self._cache_kwarg: dynamic},
            **self._last_logits,
        )
        cache.absorb(dynamic, mask)
        return out.logits[:, -1, :]

    def _sample(
        self, seqs: list[Sequence], logits: torch.Tensor
    ) -> tuple[torch.Tensor, list[float], list[list[tuple[int, float]]]]:
        uniforms = torch.rand(len(seqs), generator=self._generator)
        if self._seq_generators:  # sequences with their own seed draw from their own generator
            for row, seq in enumerate(seqs):
                own = self._seq_generators.get(id(seq))
                if own is not None:
                    uniforms[row] = torch.rand(1, generator=own)[0]
        params = [s.params for s in seqs]
        tokens, logprobs = sample_next(logits, params, uniforms)
        return tokens, logprobs.tolist(), top_logprobs(logits, params)

    def _record(
        self,
        seqs: list[Sequence],
        tokens: torch.Tensor,
        logprobs: list[float],
        tops: list[list[tuple[int, float]]],
    ) -> tuple[list[int], list[tuple[Sequence, str]]]:
        """Append each sampled token; return the rows still running and the (sequence, reason) that are done."""
        keep: list[int] = []
        finished: list[tuple[Sequence, str]] = []
        version = self.weight_version
        self.counters["generation_tokens"] += len(seqs)
        for row, (seq, token, logprob) in enumerate(zip(seqs, tokens.tolist(), logprobs, strict=True)):
            seq.output_ids.append(token)
            seq.logprobs.append(logprob)
            if seq.params.top_logprobs:
                seq.top_logprobs.append(tops[row])
            if seq.weight_versions[-1] != version:
                seq.weight_versions.append(version)
            reason = self._finish_reason(seq, token)
            if reason is None:
                keep.append(row)
            else:
                finished.append((seq, reason))
        return keep, finished

    def _finish_all(self, finished: list[tuple[Sequence, str]]) -> None:
        for seq, reason in finished:
            self._finish(seq, reason)

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        if token in seq.params.stop_token_ids or (
            not seq.params.ignore_eos and token in self.options.eos_token_ids
        ):
            return "stop"
        if seq.params.stop and self._stop_string_ends(seq):
            return "stop"
        if len(seq.output_ids) >= seq.params.max_tokens or seq.total_len >= self.options.max_model_len:
            return "length"
        return None

    def _stop_string_ends(self, seq: Sequence) -> bool:
        """Whether the text of the last tokens holds a stop string. A token decodes to at least one
        character (special tokens aside), so a string of L characters that the newest token completed
        lies within the last L + 1 tokens; a few more cover special tokens in between."""
        if self.detokenize is None:  # the server always gives one (its app refuses stop strings otherwise)
            return False
        window = max(len(s) for s in seq.params.stop) + 4
        tail = self.detokenize(seq.output_ids[-window:])
        return any(s in tail for s in seq.params.stop if s)


def accepts(model: Any, name: str) -> bool:
    """Whether the model's ``forward`` takes the argument ``name``."""
    return name in inspect.signature(model.forward).parameters


def cache_kwarg(model: Any) -> str:
    """The forward argument that takes the KV cache: ``cache`` (transformers >= 5.2x renamed
    it; ``past_key_values`` is deprecated there and goes in 5.40), else ``past_key_values``."""
    return "cache" if accepts(model, "cache") else "past_key_values"
