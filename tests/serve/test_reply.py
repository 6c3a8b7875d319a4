"""A chat reply split for the API (pyggml.serve.reply): reasoning apart, then tool calls parsed from the content,
the same whether the text comes whole or a character at a time."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pyggml.models.reasoning import ReasoningSplit
from pyggml.models.tool_calls import HermesParser
from pyggml.serve.reply import ReplySplit

THOUGHT_CALL = ('<think>\nThe user wants the weather.\n</think>\n\nLet me check.\n<tool_call>\n'
                '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')


def run(make: Any, text: str, step: int) -> tuple[str, str, list[tuple[str, Any]]]:
    reply = make()
    pieces = []
    for i in range(0, len(text), step):
        pieces += reply.feed(text[i:i + step])
    pieces += reply.flush()
    calls = [(c.name, json.loads(c.arguments)) for k, c in pieces if k == "call"]
    return ("".join(t for k, t in pieces if k == "reasoning"), "".join(t for k, t in pieces if k == "content"), calls)


@pytest.mark.parametrize("step", [1, 4, len(THOUGHT_CALL)])
def test_reasoning_then_a_call(step: int) -> None:
    got = run(lambda: ReplySplit(ReasoningSplit(), HermesParser()), THOUGHT_CALL, step)
    assert got == ("The user wants the weather.", "Let me check.", [("get_weather", {"city": "Paris"})])


def test_without_tools_the_call_is_content_and_legacy_keeps_everything() -> None:
    reasoning, content, calls = run(lambda: ReplySplit(ReasoningSplit()), THOUGHT_CALL, 3)
    assert calls == [] and content == THOUGHT_CALL.split("</think>\n\n")[1]
    reasoning, content, calls = run(lambda: ReplySplit(ReasoningSplit(), legacy=True), THOUGHT_CALL, 3)
    assert reasoning == "The user wants the weather." and content == THOUGHT_CALL and calls == []
    assert run(lambda: ReplySplit(tools=HermesParser()), "plain", 2) == ("", "plain", [])
