"""Test backends that lack ops on purpose: a CPU or torch backend whose supports_op says no to the ops named
(by ggml_op_desc: "RMS_NORM", "SWIGLU", "SET_ROWS"), as a served backend without some kernels is; a torch backend
may lack them for some types of their first source only."""

from __future__ import annotations

from collections.abc import Iterable

from pyggml.backends.cpu.backend import CPUBackend
from pyggml.core.tensor import Tensor
from pyggml.core.types import GGMLType
from pyggml.ggml_backend.backend import op_desc


def lacks(node: Tensor, ops: frozenset[str]) -> bool:
    """Whether `node`'s op (ggml_op_desc: UNARY and GLU by their function) is one of `ops`."""
    return op_desc(node) in ops


class LackingCPU(CPUBackend):
    """The CPU backend without `ops` (its computes refuse them, as every backend refuses what it lacks)."""

    def __init__(self, ops: Iterable[str], n_threads: int = 1) -> None:
        super().__init__(n_threads)
        self.lacking = frozenset(ops)

    def _supports_op(self, op: Tensor) -> bool:
        return not lacks(op, self.lacking) and super()._supports_op(op)

    def _get_name(self) -> str:
        return f"CPU without {'/'.join(sorted(self.lacking))}"


def lacking_torch(ops: Iterable[str], types: Iterable[GGMLType] | None = None) -> CPUBackend:
    """A torch backend (memory of its own: the host reaches it by copies) without `ops`; with `types`, without
    them only where their first source has one of these types."""
    from pyggml.backends.torch.backend import TorchBackend

    class LackingTorch(TorchBackend):
        def _supports_op(self, op: Tensor) -> bool:
            lacked = lacks(op, lacking) and (of_types is None or (op.src[0] is not None and op.src[0].type in of_types))
            return not lacked and super()._supports_op(op)

        def _get_name(self) -> str:
            which = "" if of_types is None else f" of {'/'.join(sorted(t.name for t in of_types))}"
            return f"Torch without {'/'.join(sorted(lacking))}{which}"

    lacking = frozenset(ops)
    of_types = None if types is None else frozenset(types)
    return LackingTorch("cpu", 1, matmul_precision="f32")  # type: ignore[return-value]
