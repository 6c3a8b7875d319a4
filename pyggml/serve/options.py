"""What a server offers beyond chat and completions, as llama-server's flags set it (the app's options)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyggml.models.pooling import EMBD_NORMALIZE
from pyggml.models.reasoning import DEFAULT_REASONING_FORMAT


@dataclass
class ServerOptions:
    """`chat_template`: a Jinja template's text in place of the file's (--chat-template-file), named
    `chat_template_name` in errors; `template_kwargs`: more template variables for every chat
    (--chat-template-kwargs; a request's `chat_template_kwargs` override them); `reasoning_format`:
    --reasoning-format (`pyggml.models.reasoning`); `embeddings`: serve /v1/embeddings and /embeddings
    (--embeddings) with `pooling` (--pooling; None: the file's) and `embd_normalize` (--embd-normalize);
    `slots`: serve /slots (--no-slots turns it off); `metrics`: serve /metrics (--metrics); `grammar` (kind,
    spec, option: pyggml.cli.run.grammar_source's) constrains the requests that bring none (--grammar,
    --json-schema and their files)."""

    chat_template: str | None = None
    chat_template_name: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    reasoning_format: str = DEFAULT_REASONING_FORMAT
    embeddings: bool = False
    pooling: str | None = None
    embd_normalize: int = EMBD_NORMALIZE
    slots: bool = True
    metrics: bool = False
    grammar: tuple[str, Any, str] | None = None
