"""Models from GGUF files (the families of the table in pyggml.models.arch):
`load(path, backends, n_ctx, n_layers_on)` -> `Model`;
`builtin_model_path()` is the small LLaMA shipped in the package.

The tokenizers and samplers live in `pyggml.models.tokenizer` and `pyggml.models.sampling`, grammars and JSON
schemas that constrain a sampler in `pyggml.models.grammar`; chat templates
and multi-turn chats in `pyggml.models.chat` (`Model.chat`).
"""

from pyggml.models.arch import ARCHS, HParams
from pyggml.models.builtin import builtin_model_path
from pyggml.models.chat import ChatSession, ChatTemplate, ChatTemplateError
from pyggml.models.graph import build_graph
from pyggml.models.llama import LlamaHParams, build_llama
from pyggml.models.model import Model, load
from pyggml.models.sampling import Sampler
from pyggml.models.tokenizer import Tokenizer

__all__ = ["ARCHS", "ChatSession", "ChatTemplate", "ChatTemplateError", "HParams", "LlamaHParams", "Model", "Sampler",
           "Tokenizer", "build_graph", "build_llama", "builtin_model_path", "load"]
