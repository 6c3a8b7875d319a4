"""CPU kernels: layout ops."""

from __future__ import annotations

from pyggml.backends.cpu.kernels import Kernel
from pyggml.core.tensor import GGMLOp

KERNELS: dict[GGMLOp, Kernel] = {}
