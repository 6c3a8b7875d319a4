"""The recurrent state beside the KV cache: llama.cpp's `llama_memory_recurrent` (llama-memory-recurrent.cpp) as
`llama_memory_hybrid` pairs it with the attention layers' cache, and the graph's reads and writes of it
(llama-graph.cpp's build_inp_rs and build_rs).

Each recurrent layer holds a conv state r [n_embd_r, n_seq_max] and (Mamba) an SSM state s [n_embd_s,
n_seq_max], F32, on the layer's backend; cell i is sequence i's. A state summarizes every position of its
sequence at once, so it can be kept, dropped whole or copied, not cut: a removal that would keep a prefix of it
is refused as llama.cpp refuses it. A sequence's first batch zeroes its cell in the graph (llama.cpp's rs_z).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pyggml.core.context import Context, tensor_overhead
from pyggml.core.errors import ArgumentError
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.core.types import GGMLType
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import Buffer
from pyggml.ggml_backend.tensor_io import tensor_get, tensor_set
from pyggml.models.arch import HParams
from pyggml.models.runner import alloc_zeroed

StateRows = Callable[[Context, Tensor, Tensor], Tensor]  # (ctx, states [size, n_cells], cell ids) -> what is read


class RecurrentStateError(ArgumentError):
    """A sequence operation the recurrent state cannot do (llama.cpp's seq_rm returns false)."""


@dataclass(frozen=True)
class StateInputs:
    """A batch's reads of the state: the cell of its one sequence (an input) and what the graph's shape holds."""

    s_copy: Tensor  # I32 [1]: the cell read (llama.cpp's rs_s_copy)
    head: int  # the cell written
    rs_z: int  # the cell zeroed before it is read, -1: none


def state_bytes(hp: HParams, n_seq_max: int) -> int:
    """Bytes of a model's recurrent state (r and s of every recurrent layer, F32)."""
    n_layers = sum(hp.is_recurrent(il) for il in range(hp.n_layer))
    return 4 * n_layers * n_seq_max * (hp.n_embd_r + hp.n_embd_s)


class RecurrentState:
    """r (and s) of each recurrent layer of `hp` for `n_seq_max` sequences, on `backend_of_layer[il]`."""

    def __init__(self, hp: HParams, n_seq_max: int, backend_of_layer: Sequence[Backend]) -> None:
        if isinstance(n_seq_max, bool) or not isinstance(n_seq_max, int) or n_seq_max < 1:
            raise ArgumentError(f"recurrent state: n_seq_max must be an int >= 1, got {n_seq_max!r}")
        self.size = n_seq_max
        self.n_embd_r, self.n_embd_s = hp.n_embd_r, hp.n_embd_s
        self.cell_pos = np.full(n_seq_max, -1, dtype=np.int64)  # each sequence's last position, -1: empty
        layers = [il for il in range(hp.n_layer) if hp.is_recurrent(il)]
        self.ctx = Context(mem_size=(2 * len(layers) + 1) * tensor_overhead(), no_alloc=True)
        self.r: dict[int, Tensor] = {}
        self.s: dict[int, Tensor] = {}
        groups: dict[int, tuple[Backend, list[Tensor]]] = {}
        for il in layers:
            tensors = [self.ctx.new_tensor_2d(GGMLType.F32, self.n_embd_r, n_seq_max).set_name(f"cache_r_l{il}")]
            self.r[il] = tensors[0]
            if self.n_embd_s:
                self.s[il] = self.ctx.new_tensor_2d(GGMLType.F32, self.n_embd_s, n_seq_max).set_name(f"cache_s_l{il}")
                tensors.append(self.s[il])
            backend = backend_of_layer[il]
            groups.setdefault(id(backend), (backend, []))[1].extend(tensors)
        self.buffers: list[Buffer] = []
        self.nbytes: dict[int, int] = {}
        try:
            for key, (backend, tensors) in groups.items():
                buffer, size = alloc_zeroed(backend, tensors, f"recurrent state on '{backend.name()}' "
                                                              f"({len(tensors)} tensors, n_seq_max {n_seq_max})")
                buffer.name = f"{backend.name()} RS buffer"
                self.buffers.append(buffer)
                self.nbytes[key] = size
        except BaseException:
            self.free()
            raise

    def free(self) -> None:
        for b in self.buffers:
            b.free()
        self.buffers = []
        self.ctx.free()

    # --- llama.cpp's llama_memory_recurrent::seq_* ---

    def _check_seq(self, seq_id: int) -> int:
        if isinstance(seq_id, bool) or not isinstance(seq_id, int | np.integer) or not 0 <= seq_id < self.size:
            raise ArgumentError(f"recurrent state: sequence id {seq_id!r} is not in [0, n_seq_max={self.size}) "
                                f"(each sequence has its own state: load with a larger n_seq_max)")
        return int(seq_id)

    def clear(self) -> None:
        self.cell_pos[:] = -1

    def seq_pos_max(self, seq_id: int) -> int:
        return int(self.cell_pos[self._check_seq(seq_id)])

    def seq_rm(self, seq_id: int, p0: int = 0, p1: int = -1) -> None:
        """Drop `seq_id`'s state if [p0, p1) (p1 < 0: to the end) covers its last position from 0; a range that
        would keep a prefix of it raises RecurrentStateError, one past it changes nothing (as llama.cpp)."""
        if self.check_rm(seq_id, p0, p1):
            self.cell_pos[seq_id] = -1

    def check_rm(self, seq_id: int, p0: int = 0, p1: int = -1) -> bool:
        """Whether `seq_rm` drops the state; RecurrentStateError where it refuses, changing nothing."""
        seq = self._check_seq(seq_id)
        pos, p0 = int(self.cell_pos[seq]), max(p0, 0)
        if not p0 <= pos < (p1 if p1 >= 0 else np.iinfo(np.int64).max):
            return False
        if p0 > 0:
            raise RecurrentStateError(f"recurrent state: sequence {seq} cannot lose positions [{p0}, "
                                      f"{p1 if p1 >= 0 else 'end'}): its state holds positions 0..{pos} as one "
                                      f"(remove the whole sequence, or nothing up to its last position)")
        return True

    def seq_cp(self, src: int, dst: int) -> None:
        """`dst` continues from `src`'s state (its whole state: llama.cpp's seq_cp ignores the positions)."""
        src, dst = self._check_seq(src), self._check_seq(dst)
        if src == dst:
            return
        self.cell_pos[dst] = self.cell_pos[src]
        if self.cell_pos[src] < 0:
            return
        for t in (*self.r.values(), *self.s.values()):
            row = np.empty(t.nb[1], dtype=np.uint8)
            tensor_get(t, row, src * t.nb[1], t.nb[1])
            tensor_set(t, row, dst * t.nb[1], t.nb[1])

    def slot(self, seq_id: int, pos: np.ndarray) -> tuple[int, int]:
        """(head, rs_z) of a batch of one sequence at `pos`, which must continue its state position by position."""
        seq = self._check_seq(seq_id)
        start = int(self.cell_pos[seq]) + 1
        if int(pos[0]) != start or (len(pos) > 1 and not (np.diff(pos) == 1).all()):
            raise RecurrentStateError(f"recurrent state: sequence {seq}'s tokens must continue at position {start} "
                                      f"one after another (its state holds 0..{start - 1}); the batch has "
                                      f"positions {pos.tolist()[:8]}{'...' if len(pos) > 8 else ''}")
        return seq, seq if start == 0 else -1

    def apply(self, seq_id: int, last_pos: int) -> None:
        self.cell_pos[seq_id] = last_pos

    # --- the graph's reads and writes (llama-graph.cpp) ---

    def inputs(self, ctx: Context, head: int, rs_z: int) -> StateInputs:
        return StateInputs(ctx.new_tensor_1d(GGMLType.I32, 1).set_name("rs_s_copy").set_input(), head, rs_z)

    def read(self, ctx: Context, gf: Graph, states: Tensor, inp: StateInputs,
             rows: StateRows | None = None) -> Tensor:
        """llama.cpp's build_rs for one sequence: its cell zeroed in place where it starts, then `rows` of it
        (default GET_ROWS: the state [size, 1]; Mamba's SSM_SCAN reads the state itself)."""
        if inp.rs_z >= 0:
            zero = ctx.view_1d(states, states.ne[0], inp.rs_z * states.nb[1])
            gf.build_forward_expand(ctx.scale_inplace(zero, 0.0))
        out = rows(ctx, states, inp.s_copy) if rows is not None else ctx.get_rows(states, inp.s_copy)
        gf.build_forward_expand(out)
        return out

    def write(self, ctx: Context, gf: Graph, states: Tensor, value: Tensor, inp: StateInputs) -> None:
        """CPY `value` (one cell's worth) into the batch's cell."""
        dst = ctx.view_2d(states, states.ne[0], 1, states.nb[1], inp.head * states.nb[1])
        gf.build_forward_expand(ctx.cpy(value, dst))

    def input_values(self, inp: StateInputs) -> list[tuple[Tensor, np.ndarray]]:
        return [(inp.s_copy, np.array([inp.head], dtype=np.int32))]


__all__ = ["RecurrentState", "RecurrentStateError", "StateInputs", "state_bytes"]
