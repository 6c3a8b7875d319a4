"""pyggml: ggml's backend layer in Python.

Tensors and graphs (`pyggml.core`), backend buffers and backends
(`pyggml.ggml_backend`, `pyggml.backends.*`), allocators (`pyggml.alloc`), the
multi-backend scheduler (`pyggml.sched`), and ggml's C API by name
(`pyggml.capi`).
"""

from pyggml.core import (
    Context,
    GGMLError,
    GGMLOp,
    GGMLType,
    Graph,
    Tensor,
    TensorFlag,
    UnaryOp,
    graph_overhead,
    tensor_overhead,
)

__version__ = "0.1.0"

__all__ = ["Context", "GGMLError", "GGMLOp", "GGMLType", "Graph", "Tensor", "TensorFlag", "UnaryOp",
           "graph_overhead", "tensor_overhead", "__version__"]
