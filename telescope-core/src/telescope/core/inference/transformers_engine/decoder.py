"""A lean prefill and decode step for Llama-family models over a slot cache written in place.

The Hugging Face forward costs far more than its kernels for one new token per row: per step it
builds a padded 4D mask, concatenates every layer's keys/values onto a growing cache and wraps
outputs in ``ModelOutput``s. ``SlotDecoder`` runs the same modules (so LoRA wrappers and in-place
weight updates apply unchanged) in a plain loop: row ``r``'s tokens sit at columns ``[0, lens[r])``
of a preallocated cache, the new token's keys/values are written at column ``lens[r]``, and the
mask is a comparison against ``lens``. ``prefill`` runs the same modules over a batch of prompts:
their tokens packed for the projections and MLPs, right-padded for attention (row ``r``'s prompt at
columns ``[0, len)``, as in the cache; batched matmuls with a causal mask), so no real position sees
a padding column. Architectures outside ``SUPPORTED`` keep the Hugging Face forward
(``core.PaddedBatch`` and its prefill).
"""

from __future__ import annotations

import itertools
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
    """A Llama-style RMSNorm (``weight * (x in float32 * rsqrt(mean(x^2) + eps)).to(dtype)``) in four
    kernels: the mean of squares as one ``vector_norm`` (torch's ``rms_norm`` on CPU is a composite of
    ten, upcasts included, and costs three times as much on the decode step's few rows)."""
    eps = getattr(module, "variance_epsilon", None)
    if not type(module).__name__.endswith("RMSNorm") or eps is None:
        return cast(Fn, module)
    eps_t = torch.tensor(float(eps), dtype=torch.float32, device=module.weight.device)

    def norm(x: torch.Tensor) -> torch.Tensor:
        xf = x.float()  # no copy in float32
        n = torch.linalg.vector_norm(xf, dim=-1, keepdim=True)
        scale = torch.addcmul(eps_t, n, n, value=1.0 / x.shape[-1]).rsqrt_()
        return module.weight * (xf * scale).to(x.dtype)

    return norm


def _fuse(modules: list[Any]) -> Fn | None:
    """One matmul for several plain ``nn.Linear`` of the same input (q/k/v; gate/up), or None.

    Their weights (and biases) are moved into one tensor and each module's parameter becomes a view
    of its rows: no extra memory, the Hugging Face forward (prefill) reads the same numbers, and an
    in-place weight update (``param.data.copy_``, as ``weights.load``) lands in the fused tensor.
    """
    if any(type(m) is not torch.nn.Linear for m in modules):
        return None  # a LoRA wrapper or other module: each keeps its own forward
    biases = [m.bias for m in modules]
    if any(b is None for b in biases) and any(b is not None for b in biases):
        return None
    with torch.no_grad():
        weight = torch.cat([m.weight.data for m in modules])
        bias = torch.cat([b.data for b in biases]) if biases[0] is not None else None
        row = 0
        for m in modules:
            rows = m.weight.shape[0]
            m.weight.data = weight[row : row + rows]
            if bias is not None:
                m.bias.data = bias[row : row + rows]
            row += rows
    return lambda x: F.linear(x, weight, bias)


def _residual(module: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``(residual, x) -> residual + module(x)``; one ``addmm`` for a plain bias-free ``nn.Linear``."""
    if type(module) is torch.nn.Linear and module.bias is None:
        return lambda residual, x: torch.addmm(residual, x, module.weight.t())
    return lambda residual, x: residual + module(x)


class _Layer:
    """The callables of one decoder layer, resolved once."""

    def __init__(self, layer: Any) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.ln1, self.ln2 = _rms_norm(layer.input_layernorm), _rms_norm(layer.post_attention_layernorm)
        projections = [attn.q_proj, attn.k_proj, attn.v_proj]
        self.qkv = _fuse(projections)
        self.q, self.k, self.v = (_linear(m) for m in projections)
        self.o = _residual(attn.o_proj)
        self.q_norm = _rms_norm(attn.q_norm) if hasattr(attn, "q_norm") else None  # Qwen3
        self.k_norm = _rms_norm(attn.k_norm) if hasattr(attn, "k_norm") else None
        self.scaling = float(attn.scaling)
        self.mlp: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = _residual(mlp)
        """(residual, x) -> residual + mlp(x)."""
        if all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")):
            down, act = _residual(mlp.down_proj), mlp.act_fn
            gate_up = _fuse([mlp.gate_proj, mlp.up_proj])
            if gate_up is not None:

                def fused_mlp(residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
                    gate, up = gate_up(x).chunk(2, dim=-1)
                    return down(residual, act(gate) * up)

                self.mlp = fused_mlp
            else:
                gate, up = _linear(mlp.gate_proj), _linear(mlp.up_proj)
                self.mlp = lambda residual, x: down(residual, act(gate(x)) * up(x))

    def project(self, x: torch.Tensor, heads: int, kv_heads: int, dim: int) -> torch.Tensor:
        """Queries, keys and values of ``x`` [rows, hidden] as [rows, heads + 2 * kv_heads, dim]."""
        rows = x.shape[0]
        if self.qkv is not None:
            return self.qkv(x).view(rows, heads + 2 * kv_heads, dim)
        parts = (self.q(x), self.k(x), self.v(x))
        return torch.cat(parts, dim=-1).view(rows, heads + 2 * kv_heads, dim)


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
        self.heads = int(model.config.num_attention_heads)
        self.max_rows, self.max_len = max_rows, max_len
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.rows = 0
        self.lens = torch.zeros(0, dtype=torch.long, device=self.device)
        self._lens: list[int] = []  # host copy: the longest row sizes the attention window without a sync
        self.kv: KV = []
        self._allocate(0, 0)
        self._rope = self._columns = torch.zeros(0)
        self._row_index = torch.arange(max_rows, device=self.device)
        self._rope_table(64)

    def _rope_table(self, length: int) -> None:
        """cos/sin of positions 0..length-1 by the model's rotary module (elementwise in the position,
        so a table row equals what the module computes for that position alone)."""
        if self._rope.shape[0] >= length:
            return
        length = min(max(length, 2 * self._rope.shape[0]), self.max_len)
        probe = torch.zeros(1, dtype=self.dtype, device=self.device)
        positions = torch.arange(length, device=self.device).unsqueeze(0)
        cos, sin = self.model.model.rotary_emb(probe, positions)
        half = self.head_dim // 2
        # rotate_half(x) * sin == swap_halves(x) * (sin with its first half negated): one table, no cat
        signed_sin = torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)
        self._rope = torch.stack([cos[0], signed_sin], dim=1)  # [length, 2, dim]: one gather per step
        self._columns = torch.arange(length, device=self.device)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary positions on x [..., heads, dim] (the model's ``x * cos + rotate_half(x) * sin``)."""
        dim = x.shape[-1]
        swapped = x.unflatten(-1, (2, dim // 2)).flip(-2).flatten(-2)
        return torch.addcmul(x * cos, swapped, sin)

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
                k[: len(rows), :, :used] = k[:, :, :used].index_select(0, index)
                v[: len(rows), :, :used] = v[:, :, :used].index_select(0, index)
        self._lens = [self._lens[r] for r in rows]
        self.rows = len(rows)
        self.lens = torch.tensor(self._lens, dtype=torch.long, device=self.device)

    def prefill(self, prompts: list[list[int]]) -> tuple[list[KV], torch.Tensor]:
        """Each prompt's keys/values (per layer [1, kv_heads, len, dim], copies) and its last position's
        logits [prompts, vocab]; the cache's rows are untouched (``add`` takes the keys/values).

        Projections and MLPs run over the prompts' tokens packed end to end (no padding computed);
        attention runs over them right-padded to the longest, one row per prompt, causal."""
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        n, width = len(prompts), max(len(p) for p in prompts)
        padded = any(len(p) != width for p in prompts)
        flat = [t for p in prompts for t in p]
        positions = torch.tensor([i for p in prompts for i in range(len(p))], device=self.device)
        # where each packed token sits in the padded [n * width] layout
        slots = torch.tensor(
            [r * width + i for r, p in enumerate(prompts) for i in range(len(p))], device=self.device
        )
        self._rope_table(width)
        rope = self._rope[positions]
        cos, sin = rope[:, :1], rope[:, 1:]  # [tokens, 1, dim]
        hidden = self.model.model.embed_tokens(torch.tensor(flat, device=self.device))  # [tokens, hidden]
        layers: KV = []
        for layer in self.layers:
            qkv = layer.project(
                layer.ln1(hidden), heads, kv_heads, dim
            )  # [tokens, heads + 2 * kv_heads, dim]
            qk = qkv[:, : heads + kv_heads]
            if layer.q_norm is not None and layer.k_norm is not None:
                qk = torch.cat([layer.q_norm(qk[:, :heads]), layer.k_norm(qk[:, heads:])], dim=1)
            qkv = torch.cat([self._rotate(qk, cos, sin), qkv[:, heads + kv_heads :]], dim=1)
            if padded:  # padding columns stay zero: finite scores, and no real query reaches them
                qkv = qkv.new_zeros(n * width, *qkv.shape[1:]).index_copy_(0, slots, qkv)
            qkv = qkv.view(n, width, heads + 2 * kv_heads, dim).transpose(1, 2)  # [n, heads, width, dim]
            q, k, v = qkv[:, :heads], qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :]
            out = self._attend_causal(q, k, v, layer)
            hidden = layer.o(hidden, out.index_select(0, slots) if padded else out)
            hidden = layer.mlp(hidden, layer.ln2(hidden))
            layers.append((k, v))
        ends = torch.tensor(list(itertools.accumulate(len(p) for p in prompts)), device=self.device) - 1
        logits = self.lm_head(self.final_norm(hidden[ends]))
        # copies: a view would keep the whole padded batch alive while any of its prompts is held
        kv = [
            [(k[r : r + 1, :, : len(p)].clone(), v[r : r + 1, :, : len(p)].clone()) for k, v in layers]
            for r, p in enumerate(prompts)
        ]
        return kv, logits

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (``tokens`` [rows]); returns the next-token logits [rows, vocab]."""
        rows, heads, kv_heads, dim = self.rows, self.heads, self.kv_heads, self.head_dim
        width = max(self._lens) + 1
        self._ensure(rows, width)
        self._rope_table(width)
        lens = self.lens  # each row's new token sits after its tokens: at position lens[r]
        hidden = self.model.model.embed_tokens(tokens)  # [rows, hidden]
        rope = self._rope[lens]
        cos, sin = rope[:, :1], rope[:, 1:]  # [rows, 1, dim]
        mask = self._mask(lens, width)
        at = self._row_index[:rows]
        for layer, (keys, values) in zip(self.layers, self.kv, strict=True):
            qkv = layer.project(layer.ln1(hidden), heads, kv_heads, dim)
            qk = qkv[:, : heads + kv_heads]
            if layer.q_norm is not None and layer.k_norm is not None:  # Qwen3: RMS norm per head
                qk = torch.cat([layer.q_norm(qk[:, :heads]), layer.k_norm(qk[:, heads:])], dim=1)
            qk = self._rotate(qk, cos, sin)  # queries and keys together: one set of kernels
            keys[at, :, lens] = qk[:, heads:]  # in place: no copy of the cache per step
            values[at, :, lens] = qkv[:, heads + kv_heads :]
            out = self._attend(qk[:, :heads], keys[:rows, :, :width], values[:rows, :, :width], mask, layer)
            hidden = layer.o(hidden, out)  # hidden + o_proj(out)
            hidden = layer.mlp(hidden, layer.ln2(hidden))
        logits = self.lm_head(self.final_norm(hidden))
        self._lens = [n + 1 for n in self._lens]
        self.lens += 1
        return logits

    def _mask(self, lens: torch.Tensor, width: int) -> torch.Tensor:
        """Added to the scores [rows * kv_heads, group, width]: row r sees columns 0..lens[r] (the new
        token included), -inf beyond."""
        mask = torch.where(self._columns[:width] > lens.unsqueeze(1), float("-inf"), 0.0)
        return mask.repeat_interleave(self.kv_heads, dim=0).unsqueeze(1)

    def _attend_causal(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: _Layer
    ) -> torch.Tensor:
        """Causal attention of q [n, heads, width, dim] over k, v [n, kv_heads, width, dim]; returns
        [n * width, heads * dim]. Batched matmuls, as ``_attend``: torch's fused CPU kernel took ten times
        longer on a batch of short prompts. The ``group`` query heads of a key/value head are stacked as
        ``group * width`` query rows of one matmul (head h reads kv head h // group, as ``repeat_kv``)."""
        n, heads, width, dim = q.shape
        kv_heads = k.shape[1]
        group = heads // kv_heads
        q3 = q.reshape(n * kv_heads, group * width, dim)
        k3, v3 = k.reshape(n * kv_heads, width, dim), v.reshape(n * kv_heads, width, dim)
        above = self._columns[:width] > self._columns[:width].unsqueeze(1)  # [query, key]: key after query
        mask = (
            torch.zeros(width, width, device=self.device).masked_fill_(above, float("-inf")).repeat(group, 1)
        )
        if q.dtype == torch.float32:
            scores = torch.baddbmm(mask, q3, k3.transpose(1, 2), alpha=layer.scaling)
        else:  # half precision: scores and softmax in float32, as the fused kernels do
            scores = torch.bmm(q3, k3.transpose(1, 2)).float() * layer.scaling + mask
        out = torch.bmm(torch.softmax(scores, dim=-1).to(v.dtype), v3)  # [n * kv_heads, group * width, dim]
        return out.view(n, heads, width, dim).transpose(1, 2).reshape(n * width, heads * dim)

    def _attend(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, layer: _Layer
    ) -> torch.Tensor:
        """Attention of one query per row: q [rows, heads, dim] over keys/values [rows, kv_heads, width,
        dim]; returns [rows, heads * dim]. Batched matmuls: for a single query torch's fused CPU kernel
        (flash attention) costs several times more. The query heads sharing a key/value head
        (grouped-query attention: head h reads kv head h // group, as ``repeat_kv``) are its rows."""
        rows, heads, dim = q.shape
        width = keys.shape[2]
        q3 = q.reshape(rows * self.kv_heads, heads // self.kv_heads, dim)
        k3 = keys.reshape(rows * self.kv_heads, width, dim)
        v3 = values.reshape(rows * self.kv_heads, width, dim)
        if q.dtype == torch.float32:
            scores = torch.baddbmm(mask, q3, k3.transpose(1, 2), alpha=layer.scaling)
        else:  # half precision: scores and softmax in float32, as the fused kernels do
            scores = torch.bmm(q3, k3.transpose(1, 2)).float() * layer.scaling + mask
        probs = torch.softmax(scores, dim=-1).to(values.dtype)
        return torch.bmm(probs, v3).reshape(rows, heads * dim)
