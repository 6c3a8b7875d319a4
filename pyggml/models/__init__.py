"""Models from GGUF files (LLaMA family): `load(path, backends, n_ctx, n_layers_on)` -> `Model`;
`builtin_model_path()` is the small LLaMA shipped in the package.

The tokenizers and samplers live in `pyggml.models.tokenizer` and `pyggml.models.sampling`; chat templates
and multi-turn chats in `pyggml.models.chat` (`Model.chat`).
"""

from pyggml.models.builtin import builtin_model_path
from pyggml.models.chat import ChatSession, ChatTemplate, ChatTemplateError
from pyggml.models.llama import LlamaHParams, build_llama
from pyggml.models.model import Model, load
from pyggml.models.sampling import Sampler
from pyggml.models.tokenizer import Tokenizer

__all__ = ["ChatSession", "ChatTemplate", "ChatTemplateError", "LlamaHParams", "Model", "Sampler", "Tokenizer",
           "build_llama", "builtin_model_path", "load"]
