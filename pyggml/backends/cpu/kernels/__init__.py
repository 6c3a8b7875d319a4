"""The CPU backend's kernel table: one kernel per op.

A kernel *prepares* one node. It gets the node, numpy views of its destination
and sources, and the compute settings, and returns a function of no arguments
that computes the node into `dst` (writing into dst's memory: `out=`, slice
assignment; never rebinding). Preparing once and calling many times is what
makes a graph plan cheap to recompute.

Views (made by `pyggml.core.memory.view`): 4-D, shape (ne3, ne2, ne1, ne0),
strides reversed `nb`, so permuted and transposed sources arrive as strided
views. Quantized types come as raw blocks (ne3, ne2, ne1, row bytes) of uint8,
BF16 as uint16. `srcs[i]` is None where `node.src[i]` is None.

Kernels read their parameters from `node.op_params` at prepare time and may
take scratch memory from `params.work` (shared by all nodes of a graph, since
they run one after another).

The numba kernels release the GIL (`nogil=True`): a process's other Python
threads (pyggml serve's HTTP event loop beside its decode loop) run during a
graph's compute instead of waiting for each kernel to return.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pyggml.backends.cpu.jit import install_cache_locator
from pyggml.backends.cpu.numerics import Numerics, resolve_numerics
from pyggml.core.tensor import GGMLOp, Tensor

install_cache_locator()  # before the kernel modules are decorated: where their compiled code goes


class WorkArea:
    """The backend's reusable scratch memory (ggml's `work_data`)."""

    def __init__(self) -> None:
        self.data = np.zeros(0, dtype=np.uint8)

    def get(self, nbytes: int) -> np.ndarray:
        """At least `nbytes` of scratch (uint8), valid until the next larger request."""
        if self.data.nbytes < nbytes:
            self.data = np.zeros(nbytes, dtype=np.uint8)
        return self.data[:nbytes]

    @property
    def size(self) -> int:
        return self.data.nbytes


@dataclass
class ComputeParams:
    """What every kernel of a plan shares: threads, scratch, which of ggml's CPU code paths they follow
    (`numerics`, see `pyggml.backends.cpu.numerics`: by default from the environment, else the host's), and
    `batch_invariant`: each output element reduced in one order whatever the batch around it (MUL_MAT's
    direct kernels at every column count, attention walking a row's own KV cells in order, see matmul and
    attention), so a sequence's results do not depend on the other sequences of its batch."""

    n_threads: int = 1
    work: WorkArea = field(default_factory=WorkArea)
    numerics: Numerics = field(default_factory=resolve_numerics)
    batch_invariant: bool = False


Compute = Callable[[], None]
Kernel = Callable[[Tensor, np.ndarray, list[np.ndarray | None], ComputeParams], Compute]


def _noop() -> None:
    pass


def view_kernel(node: Tensor, dst: np.ndarray, srcs: list[np.ndarray | None], params: ComputeParams) -> Compute:
    """VIEW, RESHAPE, PERMUTE, TRANSPOSE (and NONE): nothing to compute."""
    return _noop


def _table() -> dict[GGMLOp, Kernel]:
    from pyggml.backends.cpu.kernels import conv, custom, elementwise, layout, matmul, misc, norm, reduce, train

    table: dict[GGMLOp, Kernel] = {
        GGMLOp.NONE: view_kernel,
        GGMLOp.VIEW: view_kernel,
        GGMLOp.RESHAPE: view_kernel,
        GGMLOp.PERMUTE: view_kernel,
        GGMLOp.TRANSPOSE: view_kernel,
    }
    for module in (elementwise, layout, reduce, norm, matmul, conv, custom, misc, train):
        table.update(module.KERNELS)
    from pyggml.backends.cpu.kernels import attention

    table.update(attention.KERNELS)
    from pyggml.backends.cpu.kernels import glu, matmul_id, rows

    for module in (glu, rows, matmul_id):
        table.update(module.KERNELS)
    from pyggml.backends.cpu.kernels import conv_back

    table.update(conv_back.KERNELS)
    from pyggml.backends.cpu.kernels import ssm

    table.update(ssm.KERNELS)
    from pyggml.backends.cpu.kernels import extra

    table.update(extra.KERNELS)
    return table


KERNELS: dict[GGMLOp, Kernel] = _table()
