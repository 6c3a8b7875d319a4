"""The KV cache: keys and values of past tokens, per layer, in backend tensors.

As llama.cpp's `llama_kv_cache` (late 2023, one tensor per layer so each
layer's cache sits on that layer's backend): `k[il]` and `v[il]` each hold
`n_ctx * n_embd_gqa` elements. K is stored token-major (cell i at
`i * n_embd_gqa`), so a head's keys are rows of `head_dim` with stride
`n_embd_gqa`; V is stored transposed (channel-major, cell i at element i of
each of the `n_embd_gqa` rows of `n_ctx`), so KQ x V reads whole rows. New
entries are written inside the compute graph with CPY into views of the
cache (`store`), attention reads views of the first `n_kv` cells
(`k_view`, `v_view`).
"""

from __future__ import annotations

import numpy as np

from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.backend.backend import Backend
from pyggml.backend.buffer import Buffer
from pyggml.backend.tensor_io import tensor_set
from pyggml.core.context import Context, tensor_overhead
from pyggml.core.errors import ArgumentError
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor
from pyggml.core.types import TYPE_TRAITS, GGMLType
from pyggml.models.runner import alloc_checked


class KVWrite:
    """A CPY node writing a batch into the cache: the node, its destination view, the bytes one cell
    moves the view. `move(cells)` points both at cells further on, so a graph decoding one token can
    be computed again for the next token without being built again."""

    __slots__ = ("node", "view", "cell_bytes")

    def __init__(self, node: Tensor, view: Tensor, cell_bytes: int) -> None:
        self.node = node
        self.view = view
        self.cell_bytes = cell_bytes

    def move(self, cells: int) -> None:
        d = cells * self.cell_bytes
        for t in (self.view, self.node):  # the CPY result is a view of the cache at the same place
            t.view_offs += d
            if t.data is not None:
                t.data += d


class KVCache:
    """Per-layer K and V tensors of `n_ctx` cells, placed on `backend_of_layer[il]`."""

    def __init__(self, n_layer: int, n_ctx: int, n_embd_gqa: int, backend_of_layer: list[Backend],
                 type: GGMLType = GGMLType.F32) -> None:
        if n_ctx < 1:
            raise ArgumentError(f"KV cache: n_ctx must be >= 1, got {n_ctx}")
        if TYPE_TRAITS[type].blck_size != 1:
            raise ArgumentError(f"KV cache: type {type.name} is quantized; the cache takes F32 or F16")
        self.n_layer = n_layer
        self.n_ctx = n_ctx
        self.n_embd_gqa = n_embd_gqa
        self.type = type
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
            for row in range(g):  # V is transposed: the cells are columns, a run of n in each row
                tensor_set(self.v[il], zeros, (row * self.n_ctx + start) * es, n * es)

    def check_room(self, n_tokens: int) -> None:
        if self.n + n_tokens > self.n_ctx:
            raise ArgumentError(f"KV cache full: {self.n} cells used + {n_tokens} new tokens > n_ctx {self.n_ctx}")

    def store(self, ctx: Context, graph: Graph, il: int, k_cur: Tensor, v_cur: Tensor, n_tokens: int,
              head: int) -> list[KVWrite]:
        """Add to `graph` the copies of this batch's K and V (layer `il`) into cells head..head+n_tokens."""
        n_embd_gqa, es = self.n_embd_gqa, self.elsize
        k_view = ctx.view_1d(self.k[il], n_tokens * n_embd_gqa, es * n_embd_gqa * head)
        k_view.set_name(f"k_cache_view-{il}")
        # V^T: n_embd_gqa rows of n_ctx cells, this batch is columns head..head+n_tokens
        v_cur_t = ctx.transpose(ctx.reshape_2d(v_cur, n_embd_gqa, n_tokens))
        v_view = ctx.view_2d(self.v[il], n_tokens, n_embd_gqa, es * self.n_ctx, es * head)
        v_view.set_name(f"v_cache_view-{il}")
        k_cpy = ctx.cpy(k_cur, k_view)
        v_cpy = ctx.cpy(v_cur_t, v_view)
        graph.build_forward_expand(k_cpy)
        graph.build_forward_expand(v_cpy)
        return [KVWrite(k_cpy, k_view, es * n_embd_gqa), KVWrite(v_cpy, v_view, es)]

    def k_view(self, ctx: Context, il: int, n_kv: int, head_dim: int, n_head_kv: int) -> Tensor:
        """Keys of cells 0..n_kv as [head_dim, n_kv, n_head_kv]."""
        es = self.elsize
        return ctx.view_3d(self.k[il], head_dim, n_kv, n_head_kv, es * self.n_embd_gqa, es * head_dim, 0)

    def v_view(self, ctx: Context, il: int, n_kv: int, head_dim: int, n_head_kv: int) -> Tensor:
        """Values of cells 0..n_kv as [n_kv, head_dim, n_head_kv] (transposed: rows are channels)."""
        es = self.elsize
        return ctx.view_3d(self.v[il], n_kv, head_dim, n_head_kv, es * self.n_ctx, es * self.n_ctx * head_dim, 0)

    def free(self) -> None:
        for buffer in self.buffers:
            buffer.free()
        self.buffers = []
        self.ctx.free()
