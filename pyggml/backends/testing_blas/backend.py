"""The testing BLAS backend: MUL_MAT only, in memory of its own.

`supports_op` accepts what ggml's BLAS path takes: MUL_MAT of a contiguous
F32 or F16 `src0` with a contiguous F32 `src1` into F32 (without ggml's
"at least 32 rows" threshold, so small test graphs use it). Every other op
must run elsewhere, which is what makes the scheduler split around it.

The backend counts what tests want to see: `n_alloc_buffer` (buffers made),
`n_graph_compute` (graphs computed) and `computed` (names of the MUL_MAT
nodes it computed, in order).
"""

from __future__ import annotations

import numpy as np

from pyggml.backends.testing_blas.buffer import TESTING_BLAS_ALIGNMENT, TestingBLASBuffer
from pyggml.core.errors import ArgumentError, UnsupportedOpError
from pyggml.core.graph import Graph
from pyggml.core.tensor import GGMLOp, Tensor, is_view_op
from pyggml.core.types import GGMLType
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import tensor_buffer

_DTYPES = {GGMLType.F32: np.float32, GGMLType.F16: np.float16}


class TestingBLASBackend(Backend):
    """A MUL_MAT-only backend whose buffers are not host memory."""

    __test__ = False  # not a pytest test class

    def __init__(self, name: str = "TestBLAS") -> None:
        super().__init__()
        self._name = name
        self.n_alloc_buffer = 0
        self.n_graph_compute = 0
        self.computed: list[str] = []

    # --- hooks ---

    def _get_name(self) -> str:
        return self._name

    def _alloc_buffer(self, size: int) -> TestingBLASBuffer:
        self.n_alloc_buffer += 1
        return TestingBLASBuffer(self, size)

    def _get_alignment(self) -> int:
        return TESTING_BLAS_ALIGNMENT

    def _set_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        buffer = self._own_buffer(tensor, "tensor_set")
        pos = buffer.offset_of(tensor, offset, size)
        assert buffer.store is not None
        buffer.store[pos: pos + size] = np.frombuffer(data, dtype=np.uint8, count=size)

    def _get_tensor_async(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        buffer = self._own_buffer(tensor, "tensor_get")
        pos = buffer.offset_of(tensor, offset, size)
        assert buffer.store is not None
        np.frombuffer(data, dtype=np.uint8, count=size)[:] = buffer.store[pos: pos + size]

    def _supports_op(self, op: Tensor) -> bool:
        if op.op != GGMLOp.MUL_MAT:
            return False
        src0, src1 = op.src[0], op.src[1]
        return (src0 is not None and src1 is not None and src0.type in _DTYPES and src1.type == GGMLType.F32
                and op.type == GGMLType.F32 and src0.is_contiguous() and src1.is_contiguous())

    def _graph_compute(self, graph: Graph) -> None:
        self.n_graph_compute += 1
        for node in graph.nodes:
            if node.op == GGMLOp.NONE or is_view_op(node.op):
                continue
            if node.op != GGMLOp.MUL_MAT:  # check_graph rejects these first; kept for direct hook calls
                raise UnsupportedOpError(f"testing BLAS computes only MUL_MAT, not {node.op.name} ('{node.name}')")
            self._mul_mat(node)
            self.computed.append(node.name)

    # --- MUL_MAT ---

    def _own_buffer(self, tensor: Tensor, what: str) -> TestingBLASBuffer:
        buffer = tensor_buffer(tensor)
        if not isinstance(buffer, TestingBLASBuffer) or buffer.backend is not self:
            where = f"buffer '{buffer.name}'" if buffer is not None else "no buffer"
            raise ArgumentError(f"testing BLAS {what}: tensor '{tensor.name}' is in {where}, not in this "
                                f"backend's memory (copy it here first)")
        return buffer

    def _array(self, tensor: Tensor) -> np.ndarray:
        """The tensor's elements as a strided numpy view of the store, shape reversed `ne`."""
        buffer = self._own_buffer(tensor, "graph_compute")
        pos = buffer.offset_of(tensor, 0, tensor.nbytes())
        ne, nb = tensor.ne, tensor.nb
        return np.ndarray((ne[3], ne[2], ne[1], ne[0]), dtype=_DTYPES[tensor.type], buffer=buffer.store,
                          offset=pos, strides=(nb[3], nb[2], nb[1], nb[0]))

    def _mul_mat(self, node: Tensor) -> None:
        """ggml's MUL_MAT: dst[i3, i2, i1, i0] = sum_k src0[i3 / r3, i2 / r2, i0, k] * src1[i3, i2, i1, k]."""
        src0, src1 = node.src[0], node.src[1]
        assert src0 is not None and src1 is not None
        a = self._array(src0).astype(np.float32)
        b = self._array(src1)
        r2 = src1.ne[2] // src0.ne[2]
        r3 = src1.ne[3] // src0.ne[3]
        if r2 > 1:
            a = np.repeat(a, r2, axis=1)
        if r3 > 1:
            a = np.repeat(a, r3, axis=0)
        self._array(node)[...] = np.matmul(b, a.swapaxes(-1, -2))


def testing_blas_init(name: str = "TestBLAS") -> TestingBLASBackend:
    """A new testing BLAS backend (the way `cpu_init` makes a CPU backend)."""
    return TestingBLASBackend(name)
