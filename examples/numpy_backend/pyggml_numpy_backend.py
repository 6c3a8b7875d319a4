"""pyggml-numpy-backend: a pyggml backend in pure numpy, written outside pyggml (see README.md).

A registry "numpy" with one device "numpy" whose buffers are host memory in numpy arrays and whose
backend computes each node with a numpy expression. Found by pyggml through the entry point
`pyggml.backends: numpy` once installed, or loaded by path: `pyggml.ggml_backend.load("pyggml_numpy_backend.py")`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pyggml.core import memory
from pyggml.core.graph import Graph
from pyggml.core.tensor import GGMLOp, Tensor, UnaryOp, is_view_op
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import Backend, Buffer, BufferType, Device, DeviceType, Reg, host_memory

ALIGNMENT = 64
F32, F16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.I32
Array = np.ndarray


# --- memory: numpy arrays, registered by address so that host code (and Tensor.numpy()) reads them ---


class NumpyBuffer(Buffer):
    def __init__(self, buft: BufferType, size: int) -> None:
        super().__init__(None, size, buft=buft)
        raw = np.zeros(size + ALIGNMENT, np.uint8)
        shift = -memory.address_of(raw) % ALIGNMENT
        self.array = raw[shift: shift + max(size, 1)]
        self.base = memory.register(self.array)

    def _get_base(self) -> int:
        return self.base

    def _free_buffer(self) -> None:
        memory.unregister(self.array)

    def _bytes(self, tensor: Tensor, offset: int, size: int) -> Array:
        assert tensor.data is not None  # pyggml checked the tensor and the range before calling
        start = tensor.data + offset - self.base
        return self.array[start: start + size]

    def _set_tensor(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        self._bytes(tensor, offset, size)[:] = np.frombuffer(data, np.uint8, size)

    def _get_tensor(self, tensor: Tensor, data: memoryview, offset: int, size: int) -> None:
        np.frombuffer(data, np.uint8, size)[:] = self._bytes(tensor, offset, size)


class NumpyBufferType(BufferType):
    def _get_name(self) -> str:
        return "numpy"

    def _alloc_buffer(self, size: int) -> Buffer:
        return NumpyBuffer(self, size)

    def _get_alignment(self) -> int:
        return ALIGNMENT

    def _is_host(self) -> bool:
        return True


# --- kernels: node, views of its sources (shape reversed ne) -> the values of the node ---


def _tile(b: Array, shape: tuple[int, ...]) -> Array:
    """ggml's broadcast: b repeated to `shape`, each dimension a multiple of b's."""
    return np.tile(b, [n // m for n, m in zip(shape, b.shape, strict=True)])


def _rms_norm(n: Tensor, a: Array) -> Array:
    return a / np.sqrt(np.mean(a * a, axis=-1, keepdims=True) + np.float32(n.get_op_params_f32(0)))


def _norm(n: Tensor, a: Array) -> Array:
    x = a - a.mean(axis=-1, keepdims=True)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(n.get_op_params_f32(0)))


def _soft_max(n: Tensor, a: Array, mask: Array | None = None) -> Array:
    x = a * np.float32(n.get_op_params_f32(0))
    if mask is not None:
        x = x + mask.astype(np.float32)
    x = np.exp(x - x.max(axis=-1, keepdims=True))
    return x / x.sum(axis=-1, keepdims=True)


def _rope(n: Tensor, a: Array, pos: Array) -> Array:
    """Pairs of each row turned by pos * freq_scale * freq_base^(-2k/n_dims), as ggml (f32 running product)."""
    ne2, half = a.shape[1], a.shape[3] // 2
    theta = np.empty((ne2, half), np.float32)
    theta[:, 0] = pos[0, 0, 0, :ne2]
    theta[:, 1:] = np.power(np.float32(n.get_op_params_f32(5)), np.float32(-2.0) / np.float32(2 * half),
                            dtype=np.float32)
    np.cumprod(theta, axis=1, out=theta)
    angle = theta * np.float32(n.get_op_params_f32(6))
    c = (np.cos(angle) * np.float32(n.get_op_params_f32(8))).reshape(1, ne2, 1, half)
    s = (np.sin(angle) * np.float32(n.get_op_params_f32(8))).reshape(1, ne2, 1, half)
    neox = n.get_op_params_i32(2) & 2  # NeoX pairs (k, k + n_dims/2), else (2k, 2k + 1)
    pairs = (np.s_[..., :half], np.s_[..., half:]) if neox else (np.s_[..., 0::2], np.s_[..., 1::2])
    out = np.empty_like(a)
    x0, x1 = a[pairs[0]], a[pairs[1]]
    out[pairs[0]] = x0 * c - x1 * s
    out[pairs[1]] = x0 * s + x1 * c
    return out


def _mul_mat(n: Tensor, a: Array, b: Array) -> Array:
    """dst[i3, i2] = b[i3, i2] @ a[i3 / r3, i2 / r2]^T: a's matrices repeated over b's (ggml's broadcast)."""
    a = np.repeat(a.astype(np.float32), b.shape[1] // a.shape[1], axis=1)
    return np.matmul(b, np.repeat(a, b.shape[0] // a.shape[0], axis=0).swapaxes(-1, -2))


def _get_rows(n: Tensor, a: Array, rows: Array) -> Array:
    idx = rows[0]  # (ne12, ne11, ne10): dst[i12, i11, i10] = a[i12, i11, idx[i12, i11, i10]]
    return a[np.arange(idx.shape[0])[:, None, None], np.arange(idx.shape[1])[None, :, None], idx]


def _copy(n: Tensor, a: Array, *_: object) -> Array:
    return a.reshape(tuple(reversed(n.ne)))  # element order is kept, the node's type is the destination's


UNARY: dict[UnaryOp, Callable[[Array], Array]] = {
    UnaryOp.ABS: np.abs, UnaryOp.SGN: np.sign, UnaryOp.NEG: np.negative, UnaryOp.TANH: np.tanh,
    UnaryOp.STEP: lambda x: (x > 0).astype(np.float32), UnaryOp.RELU: lambda x: np.maximum(x, np.float32(0)),
    UnaryOp.SILU: lambda x: x / (np.float32(1) + np.exp(-x)),
}

KERNELS: dict[GGMLOp, Callable[..., Array]] = {
    GGMLOp.ADD: lambda n, a, b: a + _tile(b, a.shape), GGMLOp.SUB: lambda n, a, b: a - _tile(b, a.shape),
    GGMLOp.MUL: lambda n, a, b: a * _tile(b, a.shape), GGMLOp.DIV: lambda n, a, b: a / _tile(b, a.shape),
    GGMLOp.SCALE: lambda n, a: a * np.float32(n.get_op_params_f32(0)) + np.float32(n.get_op_params_f32(1)),
    GGMLOp.SQR: lambda n, a: a * a, GGMLOp.SQRT: lambda n, a: np.sqrt(a),
    GGMLOp.UNARY: lambda n, a: UNARY[UnaryOp(n.get_op_params_i32(0))](a),
    GGMLOp.NORM: _norm, GGMLOp.RMS_NORM: _rms_norm, GGMLOp.SOFT_MAX: _soft_max, GGMLOp.ROPE: _rope,
    GGMLOp.MUL_MAT: _mul_mat, GGMLOp.GET_ROWS: _get_rows, GGMLOp.CPY: _copy, GGMLOp.DUP: _copy, GGMLOp.CONT: _copy,
}


# --- what the kernels compute exactly as ggml does (anything else is left to another backend) ---


def _types(op: Tensor, out: set[GGMLType], *srcs: set[GGMLType]) -> bool:
    return op.type in out and all(s is not None and s.type in t for s, t in zip(op.src, srcs, strict=False))


def _repeats(a: Tensor, b: Tensor) -> bool:
    return all(m > 0 and n % m == 0 for n, m in zip(a.ne, b.ne, strict=True))


def _broadcasts(a: Tensor, b: Tensor) -> bool:
    """MUL_MAT's broadcast: b's matrices (dimensions 2 and 3) a multiple of a's."""
    return b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0


def _soft_max_ok(op: Tensor) -> bool:
    a, mask = op.src[0], op.src[1]
    assert a is not None
    plain = op.get_op_params_i32(1) == 0 and op.src[2] is None  # no ALiBi bias, no sinks
    return plain and (mask is None or (mask.type in (F32, F16) and mask.ne[:2] == a.ne[:2] and mask.ne[2:] == [1, 1]))


def _rope_ok(op: Tensor) -> bool:
    a = op.src[0]
    assert a is not None
    p = op.get_op_params_i32
    return p(2) in (0, 2) and p(1) == a.ne[0] and p(7) == 0 and p(11) == 0 and p(12) == 0 and op.src[2] is None


FLOAT, ANY_FLOAT = {F32}, {F32, F16}
SUPPORTS: dict[GGMLOp, Callable[[Tensor], bool]] = {
    **{o: (lambda op: _types(op, FLOAT, FLOAT, FLOAT) and _repeats(op.src[0], op.src[1]))
       for o in (GGMLOp.ADD, GGMLOp.SUB, GGMLOp.MUL, GGMLOp.DIV)},
    **{o: (lambda op: _types(op, FLOAT, FLOAT)) for o in (GGMLOp.SCALE, GGMLOp.SQR, GGMLOp.SQRT, GGMLOp.NORM,
                                                           GGMLOp.RMS_NORM)},
    GGMLOp.UNARY: lambda op: _types(op, FLOAT, FLOAT) and op.get_op_params_i32(0) in {int(u) for u in UNARY},
    GGMLOp.SOFT_MAX: lambda op: _types(op, FLOAT, FLOAT) and _soft_max_ok(op),
    GGMLOp.ROPE: lambda op: _types(op, FLOAT, FLOAT, {I32}) and _rope_ok(op),
    GGMLOp.MUL_MAT: lambda op: _types(op, FLOAT, ANY_FLOAT, FLOAT) and _broadcasts(op.src[0], op.src[1]),
    GGMLOp.GET_ROWS: lambda op: _types(op, FLOAT, ANY_FLOAT, {I32}) and op.src[0].ne[3] == op.src[1].ne[2],
    **{o: (lambda op: _types(op, ANY_FLOAT, ANY_FLOAT)) for o in (GGMLOp.CPY, GGMLOp.DUP, GGMLOp.CONT)},
}


def supports(op: Tensor) -> bool:
    if op.op == GGMLOp.NONE or is_view_op(op.op):
        return True
    check = SUPPORTS.get(op.op)
    return check is not None and check(op)


# --- the backend, its device and registry ---


class NumpyBackend(Backend):
    """Alignment, buffers, data transfers and supports_op come from the device and its buffer type."""

    def _get_name(self) -> str:
        return "numpy"

    def _graph_compute(self, graph: Graph) -> None:
        for node in graph.nodes:
            if node.op != GGMLOp.NONE and not is_view_op(node.op):
                srcs = [memory.tensor_view(s) if s is not None else None for s in node.src[:3]]
                while srcs and srcs[-1] is None:
                    srcs.pop()
                memory.tensor_view(node)[...] = KERNELS[node.op](node, *srcs)


class NumpyDevice(Device):
    def __init__(self, reg: Reg) -> None:
        super().__init__(reg)
        self.buft = NumpyBufferType(self)

    def _get_name(self) -> str:
        return "numpy"

    def _get_description(self) -> str:
        return f"numpy {np.__version__} on the host"

    def _get_memory(self) -> tuple[int, int]:
        return host_memory()

    def _get_type(self) -> DeviceType:
        return DeviceType.ACCEL

    def _init_backend(self, params: str | None) -> Backend:
        return NumpyBackend(self)

    def _get_buffer_type(self) -> BufferType:
        return self.buft

    def _supports_op(self, op: Tensor) -> bool:
        return supports(op)

    def _supports_buft(self, buft: BufferType) -> bool:
        return buft.is_host()


class NumpyReg(Reg):
    def __init__(self) -> None:
        super().__init__()
        self.device = NumpyDevice(self)

    def _get_name(self) -> str:
        return "numpy"

    def _get_device_count(self) -> int:
        return 1

    def _get_device(self, index: int) -> Device:
        return self.device


_reg: NumpyReg | None = None


def ggml_backend_init() -> NumpyReg:
    """The registry (one per process): the entry point, and what `pyggml.ggml_backend.load` looks for."""
    global _reg
    if _reg is None:
        _reg = NumpyReg()
    return _reg
