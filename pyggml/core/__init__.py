"""pyggml.core: types, tensors, contexts, ops and graphs (ggml.h)."""

from pyggml.core.context import Context, tensor_overhead
from pyggml.core.errors import GGMLError
from pyggml.core.graph import Graph, graph_overhead
from pyggml.core.tensor import GGMLOp, Tensor, TensorFlag, UnaryOp
from pyggml.core.types import GGMLType

__all__ = ["Context", "GGMLError", "GGMLOp", "GGMLType", "Graph", "Tensor", "TensorFlag", "UnaryOp",
           "graph_overhead", "tensor_overhead"]
