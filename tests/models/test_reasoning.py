"""The reasoning split of replies of templates that think: the whole reply and the same reply streamed in pieces
cut anywhere give the same reasoning and content."""

from __future__ import annotations

import itertools

import pytest

from pyggml.core.errors import ArgumentError
from pyggml.models.reasoning import (
    ReasoningSplit,
    check_reasoning_format,
    split_reasoning,
    template_thinks,
    thinking_forced_open,
)

# (reply, the template opened the block) -> (reasoning, content)
CASES = {
    ("<think>\nI should add.\n</think>\n\nThe answer is 4.", False): ("I should add.", "The answer is 4."),
    ("  <think>a</think>b", False): ("a", "b"),
    ("Hello <think>x</think>", False): ("", "Hello <think>x</think>"),  # not at the start: content
    ("<thin", False): ("", "<thin"),  # what looked like a tag, at the end
    ("\nhmm, 2+2\n</think>\n\n4", True): ("hmm, 2+2", "4"),
    ("never closed  ", True): ("never closed", ""),
    ("<think></think>\n\nDone", False): ("", "Done"),
    ("<think>a < b </thinker> c</think> d ", False): ("a < b </thinker> c", "d "),
    ("", False): ("", ""),
    ("plain answer", False): ("", "plain answer"),
}


def _streamed(pieces: list[str], forced_open: bool) -> tuple[str, str]:
    split = ReasoningSplit(forced_open)
    out = [p for piece in pieces for p in split.feed(piece)] + split.flush()
    assert all(text for _, text in out)  # no empty deltas
    return "".join(t for k, t in out if k == "reasoning"), "".join(t for k, t in out if k == "content")


@pytest.mark.parametrize(("reply", "forced_open"), list(CASES))
def test_split_whole_and_streamed(reply: str, forced_open: bool) -> None:
    want = CASES[(reply, forced_open)]
    assert split_reasoning(reply, forced_open) == want
    for a, b in itertools.combinations_with_replacement(range(len(reply) + 1), 2):  # every two cuts
        assert _streamed([reply[:a], reply[a:b], reply[b:]], forced_open) == want, (a, b)
    assert _streamed(list(reply), forced_open) == want  # a character at a time


def test_templates_that_think() -> None:
    assert template_thinks("{{ '<think>\\n' }}{{ content.split('</think>')[-1] }}")
    assert not template_thinks("{{ '<|im_start|>assistant\\n' }}")
    assert thinking_forced_open("<|im_start|>assistant\n<think>\n")
    assert not thinking_forced_open("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert check_reasoning_format("deepseek") == "deepseek"
    with pytest.raises(ArgumentError, match="reasoning_format must be one of none, auto, deepseek"):
        check_reasoning_format("yes")
