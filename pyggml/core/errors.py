"""The error hierarchy: every bad input raises a `GGMLError`, each also the closest built-in exception."""

from __future__ import annotations


class GGMLError(Exception):
    """Base class of every error pyggml raises on bad input."""


class ShapeError(GGMLError, ValueError):
    """An op's operands have shapes or layouts its shape rule rejects."""


class ArgumentError(GGMLError, ValueError):
    """An argument is out of its range (a dimension, a name, an op parameter)."""


class UnsupportedTypeError(GGMLError, TypeError):
    """A tensor type that an op, a conversion or a backend cannot handle."""


class ContextFullError(GGMLError, MemoryError):
    """A `Context`'s memory pool has no room for another tensor or graph."""


class NotAllocatedError(GGMLError):
    """A tensor has no memory (its `data` is None) where memory is needed."""


class OutOfBoundsError(GGMLError, IndexError):
    """A read or write outside a tensor's bytes or a buffer's range."""


class LayoutError(GGMLError, ValueError):
    """Two tensors that must have the same type, `ne` and `nb` do not."""


class BufferFreedError(GGMLError):
    """A buffer (or a backend) was used after it was freed."""


class OutOfMemoryError(GGMLError, MemoryError):
    """An allocator or a buffer has no block large enough."""


class LimitExceededError(GGMLError):
    """A named limit of ggml (MAX_FREE_BLOCKS, GGML_SCHED_MAX_BACKENDS, ...) was exceeded."""


class UnsupportedOpError(GGMLError, NotImplementedError):
    """A backend was asked to compute an op it does not support."""


class GraphError(GGMLError):
    """A graph is full, or is used in a way its allocation does not allow."""


class GGUFError(GGMLError, ValueError):
    """A GGUF file is malformed, truncated, or holds something unsupported."""


class ArgumentTypeError(GGMLError, TypeError):
    """An argument has the wrong Python type (an int where a Tensor is expected, 2.5 for a size)."""


class InvalidStateError(GGMLError, RuntimeError):
    """An object is used in a state that forbids it (a tensor freed twice, a graph with a cycle)."""


class ModelError(GGMLError, ValueError):
    """A model file's hyper-parameters or tensors do not make a model (names the key)."""


class NonFiniteError(GGMLError, FloatingPointError):
    """A computation produced NaN or infinity (names the first tensor where it appears)."""
