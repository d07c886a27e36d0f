"""A lean decode step for Llama-family models over a slot cache written in place.

The Hugging Face forward costs far more than its kernels for one new token per row: per step it
builds a padded 4D mask, concatenates every layer's keys/values onto a growing cache and wraps
outputs in ``ModelOutput``s. ``SlotDecoder`` runs the same modules (so LoRA wrappers and in-place
weight updates apply unchanged) in a plain loop: row ``r``'s tokens sit at columns ``[0, lens[r])``
of a preallocated cache, the new token's keys/values are written at column ``lens[r]``, and the
mask is a comparison against ``lens``. Architectures outside ``SUPPORTED`` keep the Hugging Face
forward (``core.PaddedBatch``); prefill always uses it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F

__all__ = ["SUPPORTED", "SlotDecoder", "supports"]

#: ``config.model_type`` values whose decoder layer is exactly: x + attn(ln1(x)), then + mlp(ln2(.)),
#: rotary positions, full attention (Qwen3 adds RMS norms on each head's queries and keys).
SUPPORTED = frozenset({"llama", "qwen2", "qwen3"})

KV = list[tuple[torch.Tensor, torch.Tensor]]
Fn = Callable[[torch.Tensor], torch.Tensor]


def supports(model: Any) -> bool:
    """Whether ``SlotDecoder`` reproduces ``model``'s forward (else the engine uses Hugging Face's)."""
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if config is None or inner is None or getattr(config, "model_type", None) not in SUPPORTED:
        return False
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        return False  # sliding windows need a windowed mask
    if getattr(config, "use_sliding_window", False):
        return False
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if not all(hasattr(inner, name) for name in needed) or not hasattr(model, "lm_head"):
        return False
    # positions index a table of cos/sin computed once: rope types that rescale with length need the module
    rope = str(getattr(inner.rotary_emb, "rope_type", "default"))
    return "dynamic" not in rope and rope != "longrope"


def _linear(module: Any) -> Fn:
    """``module`` as a function; a plain ``nn.Linear`` skips the module-call machinery (hooks, which
    decode does not use). Weights are read at each call, so in-place updates apply."""
    if type(module) is torch.nn.Linear:
        return lambda x: F.linear(x, module.weight, module.bias)
    return cast(Fn, module)  # a LoRA wrapper or another module: its own forward


def _rms_norm(module: Any) -> Fn:
    """A Llama-style RMSNorm (``weight * normalize(x in float32).to(dtype)``) as one fused kernel."""
    eps = getattr(module, "variance_epsilon", None)
    if not type(module).__name__.endswith("RMSNorm") or eps is None:
        return cast(Fn, module)

    def norm(x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)
        return module.weight * normed.to(x.dtype)

    return norm


class _Layer:
    """The callables of one decoder layer, resolved once."""

    def __init__(self, layer: Any) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.ln1, self.ln2 = _rms_norm(layer.input_layernorm), _rms_norm(layer.post_attention_layernorm)
        self.q, self.k, self.v, self.o = (
            _linear(attn.q_proj),
            _linear(attn.k_proj),
            _linear(attn.v_proj),
            _linear(attn.o_proj),
        )
        self.q_norm = _rms_norm(attn.q_norm) if hasattr(attn, "q_norm") else None  # Qwen3
        self.k_norm = _rms_norm(attn.k_norm) if hasattr(attn, "k_norm") else None
        self.scaling = float(attn.scaling)
        gated = all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn"))
        if gated:
            gate, up, down, act = (
                _linear(mlp.gate_proj),
                _linear(mlp.up_proj),
                _linear(mlp.down_proj),
                mlp.act_fn,
            )
            self.mlp: Fn = lambda x: down(act(gate(x)) * up(x))
        else:
            self.mlp = mlp


class SlotDecoder:
    """Rows of running sequences with keys/values in preallocated tensors; one ``step`` per token.

    Capacity grows by doubling (rows up to ``max_rows``, columns up to ``max_len``), so memory
    follows what runs rather than ``max_num_seqs * max_model_len``.
    """

    def __init__(self, model: Any, max_rows: int, max_len: int) -> None:
        self.model = model
        inner = model.model
        self.layers = [_Layer(layer) for layer in inner.layers]
        self.final_norm = _rms_norm(inner.norm)
        self.lm_head = _linear(model.lm_head)
        attn = inner.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.kv_heads = int(model.config.num_key_value_heads)
        # the model's own rotary helper: the exact arithmetic of its forward
        self._rope: Callable[..., tuple[torch.Tensor, torch.Tensor]] = sys.modules[
            type(attn).__module__
        ].apply_rotary_pos_emb
        self.max_rows, self.max_len = max_rows, max_len
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.rows = 0
        self.lens = torch.zeros(0, dtype=torch.long, device=self.device)
        self._lens: list[int] = []  # host copy: the longest row sizes the attention window without a sync
        self.kv: KV = []
        self._allocate(0, 0)
        self._cos = self._sin = torch.zeros(0)
        self._rope_table(64)

    def _rope_table(self, length: int) -> None:
        """cos/sin of positions 0..length-1 by the model's rotary module (elementwise in the position,
        so a table row equals what the module computes for that position alone)."""
        if self._cos.shape[0] >= length:
            return
        length = min(max(length, 2 * self._cos.shape[0]), self.max_len)
        probe = torch.zeros(1, dtype=self.dtype, device=self.device)
        positions = torch.arange(length, device=self.device).unsqueeze(0)
        cos, sin = self.model.model.rotary_emb(probe, positions)
        self._cos, self._sin = cos[0], sin[0]

    def _allocate(self, rows: int, cols: int) -> None:
        """(Re)allocate to at least ``rows`` x ``cols``, keeping the running rows' contents."""
        shape = (max(rows, 1), self.kv_heads, max(cols, 1), self.head_dim)
        old = self.kv
        self.kv = [
            (
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
            )
            for _ in self.layers
        ]
        if old and self.rows:
            n, used = self.rows, max(self._lens)
            for (k, v), (ok, ov) in zip(self.kv, old, strict=True):
                k[:n, :, :used] = ok[:n, :, :used]
                v[:n, :, :used] = ov[:n, :, :used]

    def _ensure(self, rows: int, cols: int) -> None:
        cap_rows, cap_cols = self.kv[0][0].shape[0], self.kv[0][0].shape[2]
        if rows <= cap_rows and cols <= cap_cols:
            return
        grow = (
            min(max(rows, 2 * cap_rows), self.max_rows) if rows > cap_rows else cap_rows,
            min(max(cols, 2 * cap_cols, 64), self.max_len) if cols > cap_cols else cap_cols,
        )
        self._allocate(max(grow[0], rows), max(grow[1], cols))

    @property
    def tokens(self) -> int:
        """Tokens held in the cache over all rows."""
        return sum(self._lens)

    def add(self, prompts: list[KV]) -> None:
        """Append one row per entry: its per-layer keys/values [1, heads, len, dim] (no padding)."""
        if not prompts:
            return
        lengths = [int(p[0][0].shape[2]) for p in prompts]
        self._ensure(self.rows + len(prompts), max([*lengths, *self._lens]) + 1)
        for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True)):
            row = self.rows + i
            for (k, v), (pk, pv) in zip(self.kv, prompt, strict=True):
                k[row, :, :n] = pk[0]
                v[row, :, :n] = pv[0]
        self.rows += len(prompts)
        self._lens.extend(lengths)
        self.lens = torch.tensor(self._lens, dtype=torch.long, device=self.device)

    def keep(self, rows: list[int]) -> None:
        """Keep rows ``rows`` (in that order) as rows 0..len-1; the others leave."""
        if rows == list(range(len(rows))):  # the first rows stay put: nothing to move
            pass
        elif rows:
            index = torch.tensor(rows, dtype=torch.long, device=self.device)
            used = max(self._lens[r] for r in rows)
            for k, v in self.kv:
                k[: len(rows), :, :used] = k.index_select(0, index)[:, :, :used]
                v[: len(rows), :, :used] = v.index_select(0, index)[:, :, :used]
        self._lens = [self._lens[r] for r in rows]
        self.rows = len(rows)
        self.lens = torch.tensor(self._lens, dtype=torch.long, device=self.device)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (``tokens`` [rows]); returns the next-token logits [rows, vocab]."""
        rows = self.rows
        width = max(self._lens) + 1
        self._ensure(rows, width)
        self._rope_table(width)
        lens = self.lens  # each row's new token sits after its tokens: at position lens[r]
        hidden = self.model.model.embed_tokens(tokens.unsqueeze(1))  # [rows, 1, hidden]
        cos, sin = self._cos[lens].unsqueeze(1), self._sin[lens].unsqueeze(1)  # [rows, 1, head_dim]
        # [rows, 1, 1, width], added to the scores: row r sees its columns 0..lens[r] (the new token included)
        seen = torch.arange(width, device=self.device) <= lens.unsqueeze(1)
        mask = torch.zeros(rows, 1, 1, width, dtype=torch.float32, device=self.device)
        mask.masked_fill_(~seen.view(rows, 1, 1, width), float("-inf"))
        at = torch.arange(rows, device=self.device)
        shape = (rows, 1, -1, self.head_dim)
        for layer, (keys, values) in zip(self.layers, self.kv, strict=True):
            x = layer.ln1(hidden)
            q, k, v = layer.q(x).view(shape), layer.k(x).view(shape), layer.v(x).view(shape)
            if layer.q_norm is not None and layer.k_norm is not None:
                q, k = layer.q_norm(q), layer.k_norm(k)
            q, k = self._rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            keys[at, :, lens] = k[:, :, 0]  # in place: no copy of the cache per step
            values[at, :, lens] = v[:, 0]
            out = self._attend(q, keys[:rows, :, :width], values[:rows, :, :width], mask, layer.scaling)
            hidden = hidden + layer.o(out)
            hidden = hidden + layer.mlp(layer.ln2(hidden))
        logits = self.lm_head(self.final_norm(hidden[:, -1]))
        self._lens = [n + 1 for n in self._lens]
        self.lens += 1
        return logits

    def _attend(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """Attention of one query per row: q [rows, heads, 1, dim] over keys/values [rows, kv_heads, width,
        dim]; returns [rows, 1, heads * dim]. Two batched matmuls: for a single query, torch's fused CPU
        kernel (flash attention) costs several times more. The query heads sharing a key/value head
        (grouped-query attention: heads h = kv * group + j, as ``repeat_kv``) form that head's rows."""
        rows, heads = q.shape[0], q.shape[1]
        grouped = q.reshape(rows, self.kv_heads, heads // self.kv_heads, self.head_dim)
        scores = torch.matmul(grouped, keys.transpose(2, 3)).float() * scale + mask
        probs = torch.softmax(scores, dim=-1).to(values.dtype)
        return torch.matmul(probs, values).reshape(rows, 1, heads * self.head_dim)
