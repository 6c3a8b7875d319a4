"""A chat reply's text as the API gives it: the reasoning apart (`pyggml.models.reasoning`), the tool calls parsed
(`pyggml.models.tool_calls`), the rest content; fed the text as it is generated.

    reply = ReplySplit(reasoning=ReasoningSplit(), tools=fmt.parser())
    for kind, value in reply.feed(piece):      # ("reasoning", text), ("content", text) or ("call", ToolCall)
        ...
    rest = reply.flush()
"""

from __future__ import annotations

from typing import Any

from pyggml.models.reasoning import ReasoningSplit
from pyggml.models.tool_calls import ReplyParser

Piece = tuple[str, Any]


class ReplySplit:
    """`reasoning`: the reasoning split (None: none); `legacy`: the content keeps the whole text, reasoning
    included (llama.cpp's deepseek-legacy); `tools`: the template's tool-call parser (None: no calls parsed)."""

    def __init__(self, reasoning: ReasoningSplit | None = None, tools: ReplyParser | None = None,
                 legacy: bool = False) -> None:
        self.reasoning = reasoning
        self.tools = tools
        self.legacy = legacy

    def _content(self, text: str) -> list[Piece]:
        if not text:
            return []
        return self.tools.feed(text) if self.tools is not None else [("content", text)]

    def _split(self, pieces: list[Piece], raw: str) -> list[Piece]:
        out: list[Piece] = []
        for kind, text in pieces:
            if kind == "reasoning":
                out.append((kind, text))
            elif not self.legacy:
                out += self._content(text)
        if self.legacy:
            out += self._content(raw)
        return out

    def feed(self, text: str) -> list[Piece]:
        if self.reasoning is None:
            return self._content(text)
        return self._split(self.reasoning.feed(text), text)

    def flush(self) -> list[Piece]:
        out = self._split(self.reasoning.flush(), "") if self.reasoning is not None else []
        if self.tools is not None:
            out += self.tools.flush()
        return out
