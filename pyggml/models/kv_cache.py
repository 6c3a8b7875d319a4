"""The KV cache: keys and values of past tokens, per layer, in backend tensors.

As llama.cpp's `llama_kv_cache` (late 2023, one tensor per layer so each
layer's cache sits on that layer's backend): `k[il]` and `v[il]` each hold
`n_ctx * n_embd_gqa` elements. K is stored token-major (cell i at
`i * n_embd_gqa`), so a head's keys are rows of `head_dim` with stride
`n_embd_gqa`; V is stored transposed (channel-major, cell i at element i of
each of the `n_embd_gqa` rows of `n_ctx`), so KQ x V reads whole rows. New
entries are written inside the compute graph by SET_ROWS with index tensors
(`store`, `k_idxs`, `v_idxs`: llama.cpp's cpy_k / cpy_v), so a graph serves
any cell; attention reads views of the first `n_kv` cells (`k_view`,
`v_view`). With flash attention V is stored as K (`v_trans=False`).
"""

from __future__ import annotations

import numpy as np

from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.backend.backend import Backend
from pyggml.backend.buffer import Buffer
from pyggml.backend.tensor_io import tensor_set
from pyggml.core.context import Context, tensor_overhead
from pyggml.core.errors import ArgumentError, UnsupportedOpError
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.core.types import TYPE_TRAITS, GGMLType
from pyggml.models.runner import alloc_checked


class KVCache:
    """Per-layer K and V tensors of `n_ctx` cells, placed on `backend_of_layer[il]`."""

    def __init__(self, n_layer: int, n_ctx: int, n_embd_gqa: int, backend_of_layer: list[Backend],
                 type: GGMLType = GGMLType.F32, v_trans: bool = True) -> None:
        if n_ctx < 1:
            raise ArgumentError(f"KV cache: n_ctx must be >= 1, got {n_ctx}")
        if TYPE_TRAITS[type].blck_size != 1:
            raise ArgumentError(f"KV cache: type {type.name} is quantized; the cache takes F32 or F16")
        self.n_layer = n_layer
        self.n_ctx = n_ctx
        self.n_embd_gqa = n_embd_gqa
        self.type = type
        self.v_trans = bool(v_trans)  # V channel-major (without flash attention) or token-major as K (with it)
        self.n = 0  # cells in use (tokens evaluated so far): the next token goes to cell `n`
        self.ctx = Context(mem_size=(2 * n_layer + 1) * tensor_overhead(), no_alloc=True)
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []
        for il in range(n_layer):
            self.k.append(self.ctx.new_tensor_1d(type, n_embd_gqa * n_ctx).set_name(f"cache_k_l{il}"))
            self.v.append(self.ctx.new_tensor_1d(type, n_embd_gqa * n_ctx).set_name(f"cache_v_l{il}"))
        # one buffer per backend, the layers' tensors placed in it by a tensor allocator
        self.buffers: list[Buffer] = []
        self.nbytes: dict[int, int] = {}
        groups: dict[int, tuple[Backend, list[Tensor]]] = {}
        for il, backend in enumerate(backend_of_layer):
            groups.setdefault(id(backend), (backend, []))[1].extend((self.k[il], self.v[il]))
        try:
            for backend, tensors in groups.values():
                align = backend.get_alignment()
                size = sum((t.nbytes() + align - 1) // align * align for t in tensors)
                buffer = alloc_checked(backend, size, f"KV cache on '{backend.name()}' ({len(tensors) // 2} "
                                                      f"layers, n_ctx {n_ctx})")
                buffer.name = f"{backend.name()} KV cache"
                self.buffers.append(buffer)
                # llama.cpp clears its KV cache buffers when it makes them: graphs read padded ranges of cells,
                # and memory that does not start zeroed (an RPC server's) may hold NaN there, which the mask
                # does not hide (-inf + NaN is NaN)
                try:
                    buffer.clear(0)
                except UnsupportedOpError:
                    pass  # a buffer that cannot clear itself is host memory, which starts zeroed
                talloc = TensorAllocator.new_from_buffer(buffer)
                for t in tensors:
                    talloc.alloc(t)
                self.nbytes[id(backend)] = size
        except BaseException:
            self.free()  # the buffers of the backends done so far
            raise

    @property
    def elsize(self) -> int:
        return TYPE_TRAITS[self.type].type_size

    def clear(self) -> None:
        """Forget every cell (the memory keeps its bytes; they are never read before being written)."""
        self.n = 0

    def clear_cells(self, start: int, n: int) -> None:
        """Zero cells start..start+n of every layer: after a batch that wrote NaN or inf there, since graphs
        read padded ranges of cells and a masked NaN still spreads (-inf + NaN and 0 * NaN are NaN)."""
        es, g = self.elsize, self.n_embd_gqa
        n = max(0, min(n, self.n_ctx - start))
        if n == 0:
            return
        zeros = np.zeros(n * g * es, dtype=np.uint8)
        for il in range(self.n_layer):
            tensor_set(self.k[il], zeros, start * g * es, n * g * es)
            if not self.v_trans:
                tensor_set(self.v[il], zeros, start * g * es, n * g * es)
                continue
            for row in range(g):  # V is transposed: the cells are columns, a run of n in each row
                tensor_set(self.v[il], zeros, (row * self.n_ctx + start) * es, n * es)

    def check_room(self, n_tokens: int) -> None:
        if self.n + n_tokens > self.n_ctx:
            raise ArgumentError(f"KV cache full: {self.n} cells used + {n_tokens} new tokens > n_ctx {self.n_ctx}")

    def k_idxs(self, head: int, n_tokens: int) -> np.ndarray:
        """The rows of the K cache (as [n_embd_gqa, n_ctx]) that tokens head..head+n_tokens go to: I64 [n_tokens]."""
        return np.arange(head, head + n_tokens, dtype=np.int64)

    def v_idxs(self, head: int, n_tokens: int) -> np.ndarray:
        """The rows of the V cache that this batch's values go to: the cells, as for K, when V is stored as K;
        transposed (rows of one element, llama.cpp's cpy_v), channel j of token i goes to element
        j * n_ctx + cell_i: I64 [n_embd_gqa * n_tokens], in v_cur's order (token-major)."""
        cells = np.arange(head, head + n_tokens, dtype=np.int64)
        if not self.v_trans:
            return cells
        ch = np.arange(self.n_embd_gqa, dtype=np.int64) * self.n_ctx
        return (cells[:, None] + ch[None, :]).reshape(-1)

    def store(self, ctx: Context, graph: Graph, il: int, k_cur: Tensor, v_cur: Tensor, n_tokens: int,
              k_idxs: Tensor, v_idxs: Tensor) -> list[Tensor]:
        """Add to `graph` the SET_ROWS nodes writing this batch's K and V (layer `il`) into the cells
        the index inputs name (`k_idxs`, `v_idxs`: see those methods), as llama.cpp's cpy_k / cpy_v."""
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
        """The 2023 idiom, for backends without SET_ROWS: CPY of this batch's K and V into views of cells
        head..head+n_tokens (the graph then serves that place only)."""
        g, es = self.n_embd_gqa, self.elsize
        k_view = ctx.view_1d(self.k[il], n_tokens * g, es * g * head).set_name(f"k_cache_view-{il}")
        if self.v_trans:  # V^T: n_embd_gqa rows of n_ctx cells, this batch is columns head..head+n_tokens
            v_src = ctx.transpose(ctx.reshape_2d(v_cur, g, n_tokens))
            v_view = ctx.view_2d(self.v[il], n_tokens, g, es * self.n_ctx, es * head)
        else:
            v_src = v_cur
            v_view = ctx.view_1d(self.v[il], n_tokens * g, es * g * head)
        v_view.set_name(f"v_cache_view-{il}")
        nodes = [ctx.cpy(k_cur, k_view), ctx.cpy(v_src, v_view)]
        for n in nodes:
            graph.build_forward_expand(n)
        return nodes

    def k_view(self, ctx: Context, il: int, n_kv: int, head_dim: int, n_head_kv: int) -> Tensor:
        """Keys of cells 0..n_kv as [head_dim, n_kv, n_head_kv]."""
        es = self.elsize
        return ctx.view_3d(self.k[il], head_dim, n_kv, n_head_kv, es * self.n_embd_gqa, es * head_dim, 0)

    def v_view(self, ctx: Context, il: int, n_kv: int, head_dim: int, n_head_kv: int) -> Tensor:
        """Values of cells 0..n_kv as [n_kv, head_dim, n_head_kv] (transposed: rows are channels), or
        as [head_dim, n_kv, n_head_kv] as the keys when V is not transposed (flash attention)."""
        es = self.elsize
        if not self.v_trans:
            return ctx.view_3d(self.v[il], head_dim, n_kv, n_head_kv, es * self.n_embd_gqa, es * head_dim, 0)
        return ctx.view_3d(self.v[il], n_kv, head_dim, n_head_kv, es * self.n_ctx, es * self.n_ctx * head_dim, 0)

    def free(self) -> None:
        for buffer in self.buffers:
            buffer.free()
        self.buffers = []
        self.ctx.free()
