"""A reply's reasoning apart from its content, as llama.cpp's `--reasoning-format` parses the replies of templates
that think (Qwen3, QwQ, DeepSeek-R1: `<think>...</think>` before the answer).

    split = ReasoningSplit(forced_open=thinking_forced_open(prompt))
    for piece in pieces:                       # the reply's text as it is generated
        for kind, text in split.feed(piece):   # ("reasoning", ...) or ("content", ...)
            ...
    rest = split.flush()

The reasoning is the text between `<think>` (at the reply's start, after whitespace) and `</think>`, without the
whitespace around it (llama.cpp trims it); the content is what follows `</think>`, its leading whitespace
dropped. A template whose generation prompt ends with `<think>` opened the block itself (`thinking_forced_open`,
DeepSeek-R1's, Qwen3's thinking-only ones): the reply starts inside it. A reply that does not start with
`<think>` is all content. Text that may be the start of a tag is held until the next piece tells.

Formats (`REASONING_FORMATS`, llama.cpp's names): "none" leaves the reply whole in the content; "auto" and
"deepseek" put the reasoning in `reasoning_content` (streamed as its own deltas); "deepseek-legacy" also keeps
the whole reply, tags included, in the content (streamed inline in the content only).
"""

from __future__ import annotations

from pyggml.core.errors import ArgumentError

THINK_START = "<think>"
THINK_END = "</think>"
REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")
DEFAULT_REASONING_FORMAT = "auto"  # llama-server's default: the reasoning in reasoning_content
Piece = tuple[str, str]  # ("reasoning" or "content", text)


def check_reasoning_format(name: object, what: str = "reasoning_format") -> str:
    if not isinstance(name, str) or name not in REASONING_FORMATS:
        raise ArgumentError(f"{what} must be one of {', '.join(REASONING_FORMATS)}, got {name!r}")
    return name


def template_thinks(source: str) -> bool:
    """Whether a chat template writes or strips thinking blocks (its source names the closing tag)."""
    return THINK_END in source


def thinking_forced_open(prompt: str) -> bool:
    """Whether the rendered prompt ends inside a thinking block the template opened."""
    text = prompt.rstrip()
    return text.endswith(THINK_START)


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that is a proper start of `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ReasoningSplit:
    """The streaming split of one reply (see the module's docstring)."""

    def __init__(self, forced_open: bool = False) -> None:
        self.state = "reasoning" if forced_open else "start"
        self.held = ""  # text not yet given out: a possible tag start, whitespace whose place is unknown
        self.reasoning_started = False  # the first reasoning text went out (the leading whitespace is dropped)

    def feed(self, text: str) -> list[Piece]:
        """The pieces `text` completes (a tag split across pieces waits for the rest)."""
        self.held += text
        out: list[Piece] = []
        while True:
            if self.state == "start":
                body = self.held.lstrip()
                if body.startswith(THINK_START):
                    self.held = body[len(THINK_START):]
                    self.state = "reasoning"
                    continue
                if THINK_START.startswith(body):  # empty, or a start of the tag: wait
                    return out
                self.state = "content"
                continue
            if self.state == "reasoning":
                end = self.held.find(THINK_END)
                if end >= 0:
                    self._reasoning(self.held[:end].rstrip(), out)
                    self.held = self.held[end + len(THINK_END):]
                    self.state = "after"
                    continue
                keep = _partial_suffix(self.held, THINK_END)
                ready = self.held[:len(self.held) - keep]
                tail = len(ready) - len(ready.rstrip())  # whitespace that may be the block's last
                self._reasoning(ready[:len(ready) - tail], out)
                self.held = self.held[len(ready) - tail:]
                return out
            if self.state == "after":
                body = self.held.lstrip()
                if not body:
                    self.held = ""
                    return out
                self.held, self.state = body, "content"
                continue
            if self.held:
                out.append(("content", self.held))
                self.held = ""
            return out

    def _reasoning(self, text: str, out: list[Piece]) -> None:
        if not self.reasoning_started:
            text = text.lstrip()
        if text:
            self.reasoning_started = True
            out.append(("reasoning", text))

    def flush(self) -> list[Piece]:
        """What is held at the reply's end: an unclosed block's reasoning, or text that only looked like a tag."""
        held, self.held = self.held, ""
        if self.state == "reasoning":
            out: list[Piece] = []
            self._reasoning(held.rstrip(), out)
            return out
        if self.state in ("start", "content") and held:
            return [("content", held)]
        return []


def split_reasoning(text: str, forced_open: bool = False) -> tuple[str, str]:
    """A whole reply's (reasoning, content)."""
    split = ReasoningSplit(forced_open)
    pieces = split.feed(text) + split.flush()
    return ("".join(t for k, t in pieces if k == "reasoning"), "".join(t for k, t in pieces if k == "content"))
