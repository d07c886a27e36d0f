"""A rollout's captured calls become its trajectory by exact token prefixes (gateway/capture.py)."""

from __future__ import annotations

import pytest

from telescope.core.inference.gateway.capture import CapturedCall, CaptureRegistry, RolloutLimits, assemble
from telescope.core.inference.gateway.errors import GatewayError


def call(prompt: list[int], completion: list[int]) -> CapturedCall:
    return CapturedCall(prompt, completion, [-0.1 * t for t in completion], "stop", [3])


def test_calls_that_extend_the_conversation_join_one_sequence_with_the_glue_masked() -> None:
    first = call([1, 2, 3], [10, 11])
    second = call([1, 2, 3, 10, 11, 50, 51], [12])  # 50, 51: a tool result rendered by the template
    third = call([1, 2, 3, 10, 11, 50, 51, 12, 60], [13, 14])
    (segment,), breaks = assemble([first, second, third])
    assert breaks == 0
    assert segment.prompt_ids == [1, 2, 3]
    assert segment.completion_ids == [10, 11, 50, 51, 12, 60, 13, 14]
    assert segment.loss_mask == [True, True, False, False, True, False, True, True]
    assert segment.logprobs == pytest.approx([-1.0, -1.1, 0, 0, -1.2, 0, -1.3, -1.4])
    assert segment.turns == [first, second, third]


def test_a_rewritten_history_starts_a_new_segment_and_is_counted() -> None:
    first = call([1, 2, 3], [10, 11])
    rewritten = call([1, 2, 3, 99, 50], [12])  # the agent summarised its history: 10, 11 are gone
    after = call([1, 2, 3, 99, 50, 12, 7], [13])
    segments, breaks = assemble([first, rewritten, after])
    assert breaks == 1
    assert [s.tokens for s in segments] == [[1, 2, 3, 10, 11], [1, 2, 3, 99, 50, 12, 7, 13]]
    assert segments[1].loss_mask == [True, False, True]


def test_a_token_that_differs_inside_the_prefix_breaks_it() -> None:
    # the same text re-tokenised differently by the agent's own code would look like this
    segments, breaks = assemble([call([1, 2], [10, 11]), call([1, 2, 10, 12, 5], [13])])
    assert breaks == 1 and len(segments) == 2


def test_sessions_enforce_their_limits_and_refuse_after_close() -> None:
    registry = CaptureRegistry()
    session = registry.open("r7", limits=RolloutLimits(max_calls=5, max_completion_tokens=3))
    assert registry.lookup(session.key) is session and registry.lookup("other") is None
    assert session.admit() == 3
    session.record([call([1], [10, 11])])
    assert session.admit() == 1  # a call's max_tokens is lowered to what is left
    session.record([call([1], [12])])
    with pytest.raises(GatewayError, match="used its 3 completion tokens") as info:
        session.admit()
    assert info.value.status == 403
    assert len(registry.close(session)) == 2
    with pytest.raises(GatewayError, match="rollout r7 has ended"):
        registry.lookup(session.key)
    session.record([call([1], [13])])  # a call that was running when the rollout ended is dropped
    assert len(session.calls) == 2 and len(registry) == 0
