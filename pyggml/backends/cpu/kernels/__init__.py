"""The CPU backend's kernel table: one kernel per op, each preparing a node into a compute function (DESIGN.md,
"The kernel contract")."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pyggml.backends.cpu.jit import install_cache_locator
from pyggml.backends.cpu.numerics import Numerics, X86Level, resolve_numerics, resolve_x86_level
from pyggml.core.errors import ArgumentError
from pyggml.core.tensor import GGMLOp, Tensor

install_cache_locator()  # before the kernel modules are decorated: where their compiled code goes

ENV_GRAPH_RUNNER = "PYGGML_CPU_GRAPH_RUNNER"


# the graph runner's settings (kernels.graph_runner's LEAD and BARRIER, or off) by PYGGML_CPU_GRAPH_RUNNER's values
GRAPH_RUNNER_SETTINGS = {"0": "off", "off": "off", "1": "lead", "lead": "lead", "barrier": "barrier"}


def graph_runner_default() -> str:
    """PYGGML_CPU_GRAPH_RUNNER's setting if set (0 or off, 1 or lead, barrier), else "lead"."""
    raw = (os.environ.get(ENV_GRAPH_RUNNER) or "").strip() or "lead"
    if raw not in GRAPH_RUNNER_SETTINGS:
        raise ArgumentError(f"{ENV_GRAPH_RUNNER}={raw!r}: must be one of {', '.join(GRAPH_RUNNER_SETTINGS)}")
    return GRAPH_RUNNER_SETTINGS[raw]


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
    """What every kernel of a plan shares: threads, scratch, ggml's CPU code path (`numerics`), and
    `batch_invariant`: each output element reduced in one order whatever the batch around it; `x86_level`: which
    build of ggml-cpu's x86 code the products that differ by it follow (numerics.X86_LEVELS); `graph_runner`:
    "off", or how runs of nodes with job forms are computed in one native call (kernels.graph_runner: "lead" or
    "barrier")."""

    n_threads: int = 1
    work: WorkArea = field(default_factory=WorkArea)
    numerics: Numerics = field(default_factory=resolve_numerics)
    batch_invariant: bool = False
    x86_level: X86Level = field(default_factory=resolve_x86_level)
    graph_runner: str = field(default_factory=graph_runner_default)


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
