"""The KV cache: llama.cpp's `llama_kv_cache` (llama-kv-cache.cpp), one K and one V tensor per layer on its backend.

K is token-major, V transposed (channel-major) unless flash attention; the graph writes cells by SET_ROWS
(cpy_k / cpy_v). `ordered` keeps each sequence's cells in position order (`compact` makes room), so
batch-invariant attention walks them as if the sequence were alone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from pyggml.core.context import Context, tensor_overhead
from pyggml.core.errors import ArgumentError
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.core.types import TYPE_TRAITS, GGMLType, row_size
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer import Buffer
from pyggml.ggml_backend.tensor_io import tensor_get, tensor_set
from pyggml.models.attn_rot import ATTN_ROT_DISABLE_ENV, attn_rot_disabled, hadamard, rot_sizes
from pyggml.models.runner import alloc_zeroed

log = logging.getLogger("pyggml.models")

# what the K and V tensors may hold: llama.cpp's -ctk/-ctv types (common/arg.cpp's kv_cache_types)
CACHE_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1,
               GGMLType.IQ4_NL, GGMLType.Q5_0, GGMLType.Q5_1)
N_SEQ_MAX = 64  # sequences a cell can belong to (bits of cell_seq); llama.cpp's LLAMA_MAX_SEQ is 256


def check_type(type: GGMLType) -> GGMLType:
    if type not in CACHE_TYPES:
        raise ArgumentError(f"KV cache: type {type.name} is not supported; the cache takes "
                            f"{', '.join(t.name for t in CACHE_TYPES)}")
    return type


class KVCache:
    """K and V of `n_ctx` cells by layer index, placed on `backend_of_layer[il]`, for the layers that attend."""

    def __init__(self, n_layer: int, n_ctx: int, n_embd_gqa: int, backend_of_layer: list[Backend],
                 type: GGMLType = GGMLType.F32, v_trans: bool = True, ordered: bool = False,
                 type_v: GGMLType | None = None, head_dim: int = 0, layers: Sequence[int] | None = None) -> None:
        """`head_dim`: the Hadamard rotations of quantized K and V (attn_rot, 0: none); `layers`: default all."""
        if n_ctx < 1:
            raise ArgumentError(f"KV cache: n_ctx must be >= 1, got {n_ctx}")
        if head_dim < 0 or (head_dim and n_embd_gqa % head_dim):
            raise ArgumentError(f"KV cache: head_dim {head_dim} does not divide a cell of {n_embd_gqa} values")
        type_v = type if type_v is None else type_v
        check_type(type)
        check_type(type_v)
        if v_trans and TYPE_TRAITS[type_v].is_quantized:
            # a transposed V is written one element a row; a quantized row is a whole block
            raise ArgumentError(f"KV cache: V type {type_v.name} is quantized and needs V stored as K (v_trans "
                                f"False, flash attention)")
        for t in (type, type_v):
            if n_embd_gqa % TYPE_TRAITS[t].blck_size:
                raise ArgumentError(f"KV cache: a cell of {n_embd_gqa} values is not a whole number of "
                                    f"{t.name} blocks of {TYPE_TRAITS[t].blck_size}")
        self.n_layer = n_layer
        self.n_ctx = n_ctx
        self.n_embd_gqa = n_embd_gqa
        self.type = type  # llama.cpp's type_k
        self.type_v = type_v
        self.v_trans = bool(v_trans)
        self.ordered = bool(ordered)
        # llama.cpp's unified cache: each cell's position (-1: empty) and sequences (bit s of cell_seq)
        self.cell_pos = np.full(n_ctx, -1, dtype=np.int32)
        self.cell_seq = np.zeros(n_ctx, dtype=np.uint64)
        # summaries of the cells, kept as batches are applied
        self._seq_max = np.full(N_SEQ_MAX, -1, dtype=np.int64)
        self._n_used = 0
        self._end = 0
        disabled = attn_rot_disabled()
        if disabled:
            log.warning("attention rotation force disabled (%s)", ATTN_ROT_DISABLE_ENV)  # llama.cpp's words
        # llama.cpp's attn_rot_k / attn_rot_v: the sizes of the Hadamard rotations of K and V (0: none)
        self.n_rot_k, self.n_rot_v = rot_sizes(head_dim, type, type_v, disabled)
        log.info("attn_rot_k = %d, attn_rot_v = %d, head_dim = %d", self.n_rot_k, self.n_rot_v, head_dim)
        rot_orders = sorted({n for n in (self.n_rot_k, self.n_rot_v) if n})
        backends = list({id(b): b for b in backend_of_layer}.values())
        attending = list(range(n_layer)) if layers is None else sorted(set(layers))
        if any(not 0 <= il < n_layer for il in attending):
            raise ArgumentError(f"KV cache: layers {attending} are not all within the {n_layer} layers")
        self.ctx = Context(mem_size=(2 * len(attending) + len(rot_orders) * len(backends) + 1) * tensor_overhead(),
                           no_alloc=True)
        self.k: dict[int, Tensor] = {}
        self.v: dict[int, Tensor] = {}
        for il in attending:
            self.k[il] = self.ctx.new_tensor_1d(type, n_embd_gqa * n_ctx).set_name(f"cache_k_l{il}")
            self.v[il] = self.ctx.new_tensor_1d(type_v, n_embd_gqa * n_ctx).set_name(f"cache_v_l{il}")
        # backend id -> order -> F32 [n, n]: made once per backend (llama.cpp copies them in every batch)
        self.rot: dict[int, dict[int, Tensor]] = {
            id(b): {n: self.ctx.new_tensor_2d(GGMLType.F32, n, n).set_name(f"attn_rot_hadamard_{n}")
                    for n in rot_orders} for b in backends}
        self._backend_of_layer = list(backend_of_layer)
        self.buffers: list[Buffer] = []
        self.nbytes: dict[int, int] = {}
        groups: dict[int, tuple[Backend, list[Tensor]]] = {id(b): (b, list(self.rot[id(b)].values()))
                                                          for b in backends}
        for il in attending:
            groups[id(backend_of_layer[il])][1].extend((self.k[il], self.v[il]))
        try:
            for backend, tensors in groups.values():
                n_layers = (len(tensors) - len(rot_orders)) // 2
                buffer, size = alloc_zeroed(backend, tensors, f"KV cache on '{backend.name()}' ({n_layers} layers, "
                                                              f"n_ctx {n_ctx})")
                buffer.name = f"{backend.name()} KV cache"
                self.buffers.append(buffer)
                for n, rot in self.rot[id(backend)].items():
                    tensor_set(rot, hadamard(n))
                self.nbytes[id(backend)] = size
        except BaseException:
            self.free()
            raise

    @property
    def type_k(self) -> GGMLType:
        return self.type

    def k_rot(self, il: int) -> Tensor | None:
        """The Hadamard matrix that rotates layer `il`'s Q and K (on its cache's backend); None: not rotated."""
        return self.rot[id(self._backend_of_layer[il])][self.n_rot_k] if self.n_rot_k else None

    def v_rot(self, il: int) -> Tensor | None:
        """The Hadamard matrix that rotates layer `il`'s V, and the attention's output back; None: not rotated."""
        return self.rot[id(self._backend_of_layer[il])][self.n_rot_v] if self.n_rot_v else None

    def cell_bytes(self, t: Tensor) -> int:
        return row_size(t.type, self.n_embd_gqa)

    def clear(self) -> None:
        """Forget every cell (the bytes stay; masked, they are not read before being written)."""
        self.cell_pos[:] = -1
        self.cell_seq[:] = 0
        self._refresh()

    def _refresh(self) -> None:
        used = np.flatnonzero(self.cell_pos >= 0)
        self._n_used = int(used.size)
        self._end = int(used[-1]) + 1 if used.size else 0
        self._seq_max[:] = -1
        if used.size:
            pos, seqs = self.cell_pos[used].astype(np.int64), self.cell_seq[used]
            for s in range(N_SEQ_MAX):
                hit = (seqs & (np.uint64(1) << np.uint64(s))) != 0
                if hit.any():
                    self._seq_max[s] = int(pos[hit].max())

    # --- llama.cpp's llama_kv_cells and llama_memory_seq_* ---

    @property
    def n(self) -> int:
        """Sequence 0's next position; setting it removes its cells from there on."""
        return self.seq_pos_max(0) + 1

    @n.setter
    def n(self, value: int) -> None:
        self.seq_rm(0, int(value), -1)

    def _seq_bit(self, seq_id: int) -> np.uint64:
        if isinstance(seq_id, bool) or not isinstance(seq_id, int | np.integer) or not 0 <= seq_id < N_SEQ_MAX:
            raise ArgumentError(f"KV cache: sequence id {seq_id!r} is not in [0, {N_SEQ_MAX})")
        return np.uint64(1) << np.uint64(seq_id)

    def _range(self, seq_id: int, p0: int, p1: int) -> np.ndarray:
        pos = self.cell_pos
        hit = (self.cell_seq & self._seq_bit(seq_id)) != 0
        hit &= pos >= max(p0, 0)
        if p1 >= 0:
            hit &= pos < p1
        return hit

    def seq_pos_max(self, seq_id: int) -> int:
        """llama_memory_seq_pos_max: -1 if `seq_id` has no cell."""
        self._seq_bit(seq_id)
        return int(self._seq_max[seq_id])

    def seq_rm(self, seq_id: int, p0: int = 0, p1: int = -1) -> None:
        """Remove `seq_id`'s positions [p0, p1) (p1 < 0: to the end); a cell no sequence holds is free."""
        hit = self._range(seq_id, p0, p1)
        if not hit.any():
            return
        self.cell_seq[hit] &= ~self._seq_bit(seq_id)
        self.cell_pos[hit & (self.cell_seq == 0)] = -1
        self._refresh()

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        hit = self._range(src, p0, p1)
        self.cell_seq[hit] |= self._seq_bit(dst)
        self._refresh()

    def free_cells(self, cells: np.ndarray) -> None:
        self.cell_pos[cells] = -1
        self.cell_seq[cells] = 0
        self._refresh()

    def clear_cells_at(self, cells: np.ndarray) -> None:
        cells = np.asarray(cells, dtype=np.int64)
        if cells.size == 0:
            return
        breaks = np.flatnonzero(np.diff(cells) != 1) + 1
        for run in np.split(cells, breaks):
            self.clear_cells(int(run[0]), len(run))

    def check_room(self, n_tokens: int) -> None:
        free = self.n_free()
        if n_tokens > free:
            raise ArgumentError(f"KV cache full: {self.n_ctx - free} cells used + {n_tokens} new tokens > n_ctx "
                                f"{self.n_ctx}")

    def n_free(self) -> int:
        return self.n_ctx - self._n_used

    def used_end(self) -> int:
        return self._end

    def find_slot(self, n_tokens: int, seq_ids: np.ndarray | None = None,
                  pos: np.ndarray | None = None) -> np.ndarray | None:
        """The lowest free cells for a batch; `ordered`: above each sequence's own, None when `compact` must run."""
        self.check_room(n_tokens)
        if self.ordered and seq_ids is not None and pos is not None:
            return self._ordered_slot(seq_ids, pos)
        if self._n_used == self._end:
            return np.arange(self._end, self._end + n_tokens, dtype=np.int64)
        return np.flatnonzero(self.cell_pos < 0)[:n_tokens].astype(np.int64)

    def _ordered_slot(self, seq_ids: np.ndarray, pos: np.ndarray) -> np.ndarray | None:
        free = self.cell_pos < 0
        cells = np.empty(len(seq_ids), dtype=np.int64)
        for s in dict.fromkeys(seq_ids.tolist()):
            tokens = np.flatnonzero(seq_ids == s)
            tokens = tokens[np.argsort(pos[tokens], kind="stable")]
            own = np.flatnonzero((self.cell_seq & self._seq_bit(s)) != 0)
            above = np.flatnonzero(free[own[-1] + 1:]) + own[-1] + 1 if own.size else np.flatnonzero(free)
            if above.size < tokens.size:
                return None
            cells[tokens] = above[:tokens.size]
            free[cells[tokens]] = False
        return cells

    def compact(self) -> np.ndarray:
        """Move the used cells down to 0..n_used-1 in their order, K and V byte for byte; each old cell's new place."""
        used = np.flatnonzero(self.cell_pos >= 0)
        moved = np.full(self.n_ctx, -1, dtype=np.int64)
        moved[used] = np.arange(used.size)
        if used.size and used[-1] == used.size - 1:
            return moved
        g = self.n_embd_gqa
        for tensors, channel_major in ((self.k, False), (self.v, self.v_trans)):
            for t in tensors.values():
                data = np.empty(t.nbytes(), dtype=np.uint8)
                tensor_get(t, data)
                if channel_major:  # V transposed (never quantized): the cells are columns of its n_embd_gqa rows
                    cols = data.reshape(g, self.n_ctx, TYPE_TRAITS[t.type].type_size)
                    cols[:, :used.size] = cols[:, used]
                else:
                    rows = data.reshape(self.n_ctx, self.cell_bytes(t))
                    rows[:used.size] = rows[used]
                tensor_set(t, data)
        self.cell_pos[:used.size] = self.cell_pos[used]
        self.cell_seq[:used.size] = self.cell_seq[used]
        self.cell_pos[used.size:] = -1
        self.cell_seq[used.size:] = 0
        self._refresh()
        return moved

    def apply(self, cells: np.ndarray, pos: np.ndarray, seq_ids: np.ndarray) -> None:
        self.cell_pos[cells] = pos
        self.cell_seq[cells] = np.left_shift(np.uint64(1), seq_ids.astype(np.uint64))
        self._n_used += len(cells)
        self._end = max(self._end, int(cells.max()) + 1)
        np.maximum.at(self._seq_max, seq_ids, pos)

    def mask(self, pos: np.ndarray, seq_ids: np.ndarray, n_kv: int, n_swa: int = 0) -> np.ndarray:
        """KQ_mask [n_tokens, n_kv]: 0 where a token sees a cell of its sequence at an earlier position (within
        n_swa: llama.cpp's is_masked_swa), -inf elsewhere."""
        cell_pos = self.cell_pos[:n_kv]
        bits = np.left_shift(np.uint64(1), seq_ids.astype(np.uint64))
        sees = (self.cell_seq[None, :n_kv] & bits[:, None]) != 0
        sees &= cell_pos[None, :] <= pos[:, None]
        if n_swa:
            sees &= pos[:, None] - cell_pos[None, :] < n_swa
        return np.where(sees, np.float32(0), np.float32(-np.inf)).astype(np.float32)

    def clear_cells(self, start: int, n: int) -> None:
        """Zero cells start..start+n of every layer (a batch wrote NaN there, which spreads through the mask)."""
        g = self.n_embd_gqa
        n = max(0, min(n, self.n_ctx - start))
        if n == 0:
            return
        for il in self.k:
            # zero bytes are zeros in every cache type (a quantized block's scale 0)
            for t in (self.k[il],) if self.v_trans else (self.k[il], self.v[il]):
                cb = self.cell_bytes(t)
                tensor_set(t, np.zeros(n * cb, dtype=np.uint8), start * cb, n * cb)
            if not self.v_trans:
                continue
            es = TYPE_TRAITS[self.type_v].type_size
            zeros = np.zeros(n * es, dtype=np.uint8)
            for row in range(g):  # V is transposed: the cells are columns, a run of n in each row
                tensor_set(self.v[il], zeros, (row * self.n_ctx + start) * es, n * es)

    def k_idxs(self, cells: np.ndarray) -> np.ndarray:
        return cells.astype(np.int64)

    def v_idxs(self, cells: np.ndarray) -> np.ndarray:
        """V's rows for this batch: the cells, or transposed (cpy_v) channel j of token i to j * n_ctx + cell_i."""
        cells = cells.astype(np.int64)
        if not self.v_trans:
            return cells
        ch = np.arange(self.n_embd_gqa, dtype=np.int64) * self.n_ctx
        return (cells[:, None] + ch[None, :]).reshape(-1)

    def store(self, ctx: Context, graph: Graph, il: int, k_cur: Tensor, v_cur: Tensor, n_tokens: int,
              k_idxs: Tensor, v_idxs: Tensor) -> list[Tensor]:
        """SET_ROWS nodes writing layer `il`'s K and V into the cells `k_idxs`/`v_idxs` name (cpy_k / cpy_v)."""
        g = self.n_embd_gqa
        k_cache = ctx.reshape_2d(self.k[il], g, self.n_ctx).set_name(f"k_cache_view-{il}")
        k_set = ctx.set_rows(k_cache, ctx.reshape_2d(k_cur, g, n_tokens), k_idxs)
        if self.v_trans:  # each element a row of one: V^T's n_embd_gqa rows of n_ctx cells
            v_cache = ctx.reshape_2d(self.v[il], 1, g * self.n_ctx)
            v_src = ctx.reshape_2d(v_cur, 1, g * n_tokens)
        else:
            v_cache = ctx.reshape_2d(self.v[il], g, self.n_ctx)
            v_src = ctx.reshape_2d(v_cur, g, n_tokens)
        v_cache.set_name(f"v_cache_view-{il}")
        v_set = ctx.set_rows(v_cache, v_src, v_idxs)
        graph.build_forward_expand(k_set)
        graph.build_forward_expand(v_set)
        return [k_set, v_set]

    def store_cpy(self, ctx: Context, graph: Graph, il: int, k_cur: Tensor, v_cur: Tensor, n_tokens: int,
                  head: int) -> list[Tensor]:
        """Without SET_ROWS: CPY of K and V into views of cells head..head+n_tokens (a graph for that place only)."""
        g = self.n_embd_gqa
        k_view = ctx.view_1d(self.k[il], n_tokens * g, self.cell_bytes(self.k[il]) * head)
        k_view.set_name(f"k_cache_view-{il}")
        if self.v_trans:  # V^T: n_embd_gqa rows of n_ctx cells, this batch is columns head..head+n_tokens
            es = TYPE_TRAITS[self.type_v].type_size
            v_src = ctx.transpose(ctx.reshape_2d(v_cur, g, n_tokens))
            v_view = ctx.view_2d(self.v[il], n_tokens, g, es * self.n_ctx, es * head)
        else:
            v_src = v_cur
            v_view = ctx.view_1d(self.v[il], n_tokens * g, self.cell_bytes(self.v[il]) * head)
        v_view.set_name(f"v_cache_view-{il}")
        nodes = [ctx.cpy(k_cur, k_view), ctx.cpy(v_src, v_view)]
        for n in nodes:
            graph.build_forward_expand(n)
        return nodes

    def k_view(self, ctx: Context, il: int, n_kv: int, head_dim: int, n_head_kv: int) -> Tensor:
        t = self.k[il]
        return ctx.view_3d(t, head_dim, n_kv, n_head_kv, self.cell_bytes(t), row_size(t.type, head_dim), 0)

    def v_view(self, ctx: Context, il: int, n_kv: int, head_dim: int, n_head_kv: int) -> Tensor:
        """Values of cells 0..n_kv as [n_kv, head_dim, n_head_kv] when transposed, else as the keys."""
        t = self.v[il]
        if not self.v_trans:
            return ctx.view_3d(t, head_dim, n_kv, n_head_kv, self.cell_bytes(t), row_size(t.type, head_dim), 0)
        es = TYPE_TRAITS[t.type].type_size
        return ctx.view_3d(self.v[il], n_kv, head_dim, n_head_kv, es * self.n_ctx, es * self.n_ctx * head_dim, 0)

    def free(self) -> None:
        for buffer in self.buffers:
            buffer.free()
        self.buffers = []
        self.ctx.free()
