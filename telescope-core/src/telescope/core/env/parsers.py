"""Answer extraction helpers shared by environments (pure string functions, never raise)."""

from __future__ import annotations

import re

__all__ = [
    "extract_answer_tags",
    "extract_boxed_answer",
    "extract_code_block",
    "extract_xml_tag",
    "normalize_whitespace",
    "strip_eos",
    "strip_think_tags",
    "verify_exact_match",
]

_CODE_BLOCK = re.compile(r"```([\w+#.-]*)[ \t]*\n(.*?)```", re.DOTALL)


def strip_eos(text: str, eos_token: str) -> str:
    """Drop one trailing ``eos_token`` (and whitespace after it) when present."""
    stripped = text.rstrip()
    if eos_token and stripped.endswith(eos_token):
        return stripped[: -len(eos_token)]
    return text


def strip_think_tags(text: str) -> str:
    """The text after the last ``</think>``, stripped; the whole text when there is none."""
    idx = text.rfind("</think>")
    if idx < 0:
        return text
    return text[idx + len("</think>") :].strip()


def extract_boxed_answer(text: str) -> str:
    """Content of the last ``\\boxed{...}`` with nested braces matched; ``""`` if none.

    Falls back to ``boxed{`` without the backslash. An unbalanced last box is skipped in
    favour of the previous balanced one.
    """
    for marker in ("\\boxed{", "boxed{"):
        start = text.rfind(marker)
        while start >= 0:
            content = _balanced_braces(text, start + len(marker))
            if content is not None:
                return content.strip()
            start = text.rfind(marker, 0, start)
    return ""


def _balanced_braces(text: str, pos: int) -> str | None:
    """Text from ``pos`` up to the brace closing the one just before ``pos``, or None."""
    depth = 1
    for i in range(pos, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[pos:i]
    return None


def extract_xml_tag(text: str, tag: str) -> str | None:
    """Content of the last ``<tag>...</tag>`` (stripped), or None when there is none."""
    matches = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, re.DOTALL)
    return matches[-1].strip() if matches else None


def extract_answer_tags(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>``, or None."""
    return extract_xml_tag(text, "answer")


def extract_code_block(text: str, language: str = "python") -> str | None:
    """The last fenced code block tagged ``language`` (case-insensitive), else the last
    fenced block of any language, else None."""
    blocks = _CODE_BLOCK.findall(text)
    if not blocks:
        return None
    tagged = [code for lang, code in blocks if lang.lower() == language.lower()]
    return (tagged[-1] if tagged else blocks[-1][1]).strip("\n")


def normalize_whitespace(text: str) -> str:
    """Collapse runs of whitespace to one space and strip."""
    return " ".join(text.split())


def verify_exact_match(prediction: str, ground_truth: str) -> bool:
    """String equality after whitespace normalisation."""
    return normalize_whitespace(prediction) == normalize_whitespace(ground_truth)
