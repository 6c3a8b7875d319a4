"""pyggml.backend: backend buffers, backends, and the functions of ggml-backend.h."""

from pyggml.backend.backend import Backend
from pyggml.backend.buffer import Buffer

__all__ = ["Backend", "Buffer"]
