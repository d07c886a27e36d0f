"""The built-in tiny model: built locally, deterministic, loadable with the Auto classes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from telescope.core.models.tiny import TINY_MODEL_SPECS, build_tiny_model, resolve_model_path


def test_resolve_passes_other_names_through() -> None:
    assert resolve_model_path("Qwen/Qwen2.5-3B") == "Qwen/Qwen2.5-3B"
    assert resolve_model_path("/some/local/dir") == "/some/local/dir"


def test_unknown_builtin_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="telescope/tiny"):
        resolve_model_path("telescope/huge")


def test_tiny_model_loads_with_auto_classes(tiny_path: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    tok = AutoTokenizer.from_pretrained(tiny_path)
    cfg = model.config
    assert (cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers) == ("qwen2", 128, 2)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.tie_word_embeddings) == (4, 2, True)
    assert 300 <= len(tok) <= 500 and cfg.vocab_size == len(tok)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert cfg.eos_token_id == tok.eos_token_id
    text = tok.apply_chat_template(
        [{"role": "user", "content": "reverse: hello"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nreverse: hello<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 2  # special tokens are single ids


def test_tokenizer_ids_survive_reload_with_the_raw_tokenizer(tiny_path: str) -> None:
    # transformers rebuilds Qwen2's pre-tokenizer on load: ids must equal the trained tokenizer's.
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    raw = Tokenizer.from_file(str(Path(tiny_path) / "tokenizer.json"))
    tok = AutoTokenizer.from_pretrained(tiny_path)
    for text in ["The quick brown fox's 12 + 30 = 42!", "  spaces\n\nand\ttabs", "ünïcödé ok"]:
        assert (
            tok(text, add_special_tokens=False)["input_ids"] == raw.encode(text, add_special_tokens=False).ids
        )


def test_build_is_deterministic(tmp_path: Path, tiny_path: str) -> None:
    build_tiny_model("telescope/tiny", tmp_path / "again")

    def digest(folder: Path) -> str:
        return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()

    assert digest(tmp_path / "again") == digest(Path(tiny_path))
    assert (tmp_path / "again" / "tokenizer.json").read_text() == (
        Path(tiny_path) / "tokenizer.json"
    ).read_text()


def test_specs_have_distinct_seeds() -> None:
    seeds = [spec.seed for spec in TINY_MODEL_SPECS.values()]
    assert len(set(seeds)) == len(seeds)
