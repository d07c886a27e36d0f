"""The built-in tiny demo models: a small Qwen2-architecture model and a locally trained tokenizer.

Nothing is downloaded. ``resolve_model_path("telescope/tiny-reverse")`` builds the model once
(deterministically: same name -> same weights and vocabulary), saves it with ``save_pretrained``
under ``$TELESCOPE_CACHE_DIR/models/<name>`` (default ``~/.cache/telescope/models/<name>``) and
returns that folder, which ``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained`` load.
Any other name (a hub id or a local path) is returned unchanged.

The tokenizer is a byte-level BPE trained with ``tokenizers`` on a small built-in corpus, with
Qwen2's own normalizer and pre-tokenizer: transformers loads ``Qwen2Tokenizer`` for a ``qwen2``
config and rebuilds those two pieces, so training with anything else would change ids on reload.
torch/transformers/tokenizers are imported only when a model is built.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from telescope.core.models.warmstart import Example

__all__ = [
    "TINY_MODEL_SPECS",
    "TinyModelSpec",
    "build_tiny_model",
    "builtin_model_name",
    "cache_dir",
    "cached_tiny_model",
    "resolve_model_path",
]

PREFIX = "telescope/"
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (PAD_TOKEN, "<|im_start|>", EOS_TOKEN)
# Qwen2's pre-tokenizer split (the same regex transformers re-applies when loading a qwen2 tokenizer).
QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Bump when the builder changes, so stale cached folders are rebuilt instead of reused.
BUILD_VERSION = "3"


@dataclass(frozen=True)
class TinyModelSpec:
    """Architecture and seed of one built-in model."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int = 384
    max_position_embeddings: int = 4096
    seed: int = 0
    warm_start_steps: int = 0
    """Supervised steps on the demo task's solutions after initialisation (0 = random weights)."""
    warm_start_label_smoothing: float = 0.0
    """Label smoothing of the warm start: leaves the skill under-confident, for RL to sharpen."""


TINY_MODEL_SPECS: dict[str, TinyModelSpec] = {
    # ~0.33M parameters: unit tests and the CPU quickstart.
    "telescope/tiny": TinyModelSpec(128, 2, 4, 2, 256),
    # The quickstart's policy: warm-started on reverse_text solutions, under-confident (RL sharpens
    # it): greedy decoding scores ~0.83 LCS, sampling at temperature 1 ~0.51. With 200 plain steps
    # both were ~0.1 apart (0.55 / 0.46), and 100 GRPO steps gained barely that (+0.06..+0.14).
    "telescope/tiny-reverse": TinyModelSpec(
        128, 2, 4, 2, 256, seed=1, warm_start_steps=400, warm_start_label_smoothing=0.2
    ),
    # ~2.4M parameters: CPU end-to-end runs that should visibly learn.
    "telescope/small": TinyModelSpec(256, 4, 4, 2, 512, seed=2),
}


def cache_dir() -> Path:
    """Root of Telescope's cache: ``$TELESCOPE_CACHE_DIR`` or ``~/.cache/telescope``."""
    root = os.environ.get("TELESCOPE_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "telescope"


def resolve_model_path(name: str) -> str:
    """Map a built-in name to its (built on first use) folder; pass any other name through.

    Raises:
        ValueError: ``name`` starts with ``telescope/`` but is not a built-in model.
    """
    if not name.startswith(PREFIX):
        return name
    if name not in TINY_MODEL_SPECS:
        valid = ", ".join(sorted(TINY_MODEL_SPECS))
        raise ValueError(f"unknown built-in model {name!r}; built-in models are: {valid}")
    return cached_tiny_model(name.replace("/", "--"), TINY_MODEL_SPECS[name])


def cached_tiny_model(key: str, spec: TinyModelSpec, examples: Example | None = None) -> str:
    """Folder ``cache_dir()/models/<key>`` holding ``spec`` built (once, under a file lock) with
    ``build_tiny_model``'s ``examples``. ``key`` names the build: a caller whose ``spec`` or
    ``examples`` change gives the new build a new key (the folder is reused while it exists)."""
    target = cache_dir() / "models" / key
    marker = target / ".telescope_build"
    if _is_built(marker):
        return str(target)
    from filelock import FileLock

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not _is_built(marker):  # another process may have built it while we waited
            build_tiny_model(spec, target, examples=examples)
    return str(target)


def builtin_model_name(model: str) -> str:
    """The name a user wrote for ``model``: a folder ``resolve_model_path`` built maps back to
    its built-in name (``.../telescope--tiny-reverse`` -> ``telescope/tiny-reverse``); any
    other value is returned unchanged. Workers get the resolved folder, people read the name."""
    folder = Path(model).name
    name = folder.replace("--", "/", 1)
    if folder.startswith(PREFIX.rstrip("/") + "--") and name in TINY_MODEL_SPECS:
        return name
    return model


def _is_built(marker: Path) -> bool:
    return marker.is_file() and marker.read_text().strip() == BUILD_VERSION


def build_tiny_model(
    name: str | TinyModelSpec, target: str | os.PathLike[str], *, examples: Example | None = None
) -> None:
    """Build model ``name`` (a built-in name or any spec, e.g. a benchmark's) into folder
    ``target`` (replaced atomically when complete). A spec with ``warm_start_steps`` is warm-started
    on ``examples`` (``telescope.core.models.warmstart.Example``; default: reverse_text's)."""
    spec = name if isinstance(name, TinyModelSpec) else TINY_MODEL_SPECS[name]
    target = Path(target)
    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    try:
        tokenizer = _build_tokenizer(spec.vocab_size)
        tokenizer.save_pretrained(staging)
        model = _build_model(spec, tokenizer)
        if spec.warm_start_steps:
            from telescope.core.models.warmstart import reverse_example, warm_start

            warm_start(
                model,
                tokenizer,
                examples or reverse_example,
                steps=spec.warm_start_steps,
                seed=spec.seed,
                label_smoothing=spec.warm_start_label_smoothing,
            )
        model.save_pretrained(staging)
        (staging / ".telescope_build").write_text(BUILD_VERSION)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _build_tokenizer(vocab_size: int):  # type: ignore[no-untyped-def]
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=None,
        chat_template=CHATML_TEMPLATE,
        model_max_length=4096,
    )


def _training_corpus() -> list[str]:
    """A fixed corpus: words, digits, arithmetic and ChatML turns (deterministic by construction)."""
    words = (
        "the quick brown fox jumps over lazy dog reverse text answer question what is sum of "
        "number letters word sentence please think step by step final result equals plus minus "
        "times divided count down target solve puzzle correct wrong true false hello world user "
        "assistant system tool call return value python code print def if else for in and or not"
    ).split()
    lines = [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    lines += [f"{a} + {b} = {a + b}. {a} * {b} = {a * b}" for a in range(0, 40, 3) for b in range(1, 30, 4)]
    lines += ["".join(reversed(w)) + " " + w for w in words]
    lines += [
        f"<|im_start|>user\nreverse: {w}<|im_end|>\n<|im_start|>assistant\n{w[::-1]}<|im_end|>" for w in words
    ]
    lines += ["<think>\n</think>\n<answer></answer> \\boxed{42} (1, 2) [3] {4} \"'.,;:!?-_/#@$%^&|<>~`"]
    return lines * 2


def _build_model(spec: TinyModelSpec, tokenizer):  # type: ignore[no-untyped-def]
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model
