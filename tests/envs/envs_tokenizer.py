"""A tiny ChatML tokenizer built locally (no hub): byte-level BPE + a jinja chat template."""

from __future__ import annotations

from typing import Any

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] }}"
    "{% if not (loop.last and continue_final_message is defined and continue_final_message) %}"
    "{{ '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}"
)


def build_tiny_tokenizer() -> Any:
    """A PreTrainedTokenizerFast with ChatML special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = [
        "You are a helpful assistant. Solve the problem and answer.",
        "<think> </think> <answer> </answer>",
    ]
    tok.train_from_iterator(corpus * 10, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML_TEMPLATE
    return fast
