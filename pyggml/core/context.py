"""`Context`: ggml's `ggml_context`, the pool that tensors and graphs come from.

As in ggml, every tensor object and graph takes room in the pool
(`tensor_overhead()`, `graph_overhead()`), and with `no_alloc=False` the
tensor's data too, in an arena the context owns, so a short script can fill
tensors and compute without any backend. With `no_alloc=True` tensors get
memory later from a backend buffer.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from pyggml.core import memory
from pyggml.core.errors import ArgumentError, ContextFullError
from pyggml.core.ops import OpBuilders
from pyggml.core.tensor import GGML_MAX_DIMS, Tensor, default_strides, nbytes_of
from pyggml.core.types import TYPE_TRAITS, GGMLType, as_type

GGML_MEM_ALIGN = 16
GGML_OBJECT_SIZE = 32
GGML_TENSOR_SIZE = 336  # sizeof(struct ggml_tensor) in ggml of late 2023
GGML_DEFAULT_GRAPH_SIZE = 2048


def pad(x: int, n: int) -> int:
    """GGML_PAD: round x up to a multiple of n."""
    return (x + n - 1) // n * n


def tensor_overhead() -> int:
    """Pool bytes a tensor object takes (ggml_tensor_overhead)."""
    return GGML_OBJECT_SIZE + GGML_TENSOR_SIZE


class Context(OpBuilders):
    """A pool of tensors and graphs. Op builders are methods: `ctx.mul_mat(a, b)`."""

    def __init__(self, mem_size: int = 16 * 1024 * 1024, mem_buffer: np.ndarray | None = None,
                 no_alloc: bool = False) -> None:
        if mem_size < 0:
            raise ArgumentError(f"context mem_size must be >= 0, got {mem_size}")
        self.mem_size = mem_size
        self.no_alloc = no_alloc
        self.tensors: list[Tensor] = []
        self.graphs: list[object] = []
        self._used = 0  # bytes of the pool taken so far (objects and data)
        self._offs0 = 0  # bytes skipped at the start of the arena to align the first object
        self._limit = mem_size  # end offset of the usable pool in the arena
        self._arena: np.ndarray | None = None
        self._arena_owned = mem_buffer is None
        self._base: int | None = None
        self._by_name: dict[str, Tensor] = {}
        if mem_buffer is not None:
            arena = np.asarray(mem_buffer).reshape(-1).view(np.uint8)
            if arena.nbytes < mem_size:
                raise ArgumentError(f"mem_buffer holds {arena.nbytes} bytes, mem_size asks {mem_size}")
            self._arena = arena[:mem_size]
        elif not no_alloc and mem_size > 0:
            self._arena = np.zeros(mem_size + GGML_MEM_ALIGN, dtype=np.uint8)
        if self._arena is not None:
            self._base = memory.register(self._arena)
            self._offs0 = (-self._base) % GGML_MEM_ALIGN  # first object aligned like ggml's
            self._used = self._offs0
            if self._arena_owned:
                self._limit = mem_size + self._offs0  # the owned arena has GGML_MEM_ALIGN spare bytes for this

    # --- lifecycle ---

    def free(self) -> None:
        """ggml_free: release the arena; tensors of this context lose their memory."""
        if self._arena is not None:
            memory.unregister(self._arena)
            for t in self.tensors:
                if t.buffer is None and t.data is not None:
                    t.data = None
            self._arena = None
        self.tensors.clear()
        self._by_name.clear()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()

    def used_mem(self) -> int:
        return self._used - self._offs0

    def get_mem_size(self) -> int:
        return self.mem_size

    def get_no_alloc(self) -> bool:
        return self.no_alloc

    def set_no_alloc(self, no_alloc: bool) -> None:
        self.no_alloc = no_alloc

    def get_max_tensor_size(self) -> int:
        return max((t.nbytes() for t in self.tensors), default=0)

    # --- pool ---

    def _take(self, nbytes: int, what: str) -> int:
        """Reserve `nbytes` of the pool, padded to GGML_MEM_ALIGN as ggml_new_object pads it.

        Returns the offset of the object in the arena; base + offset is GGML_MEM_ALIGN-aligned
        (`_used` stays `_offs0` plus a multiple of GGML_MEM_ALIGN).
        """
        start = self._used
        end = start + pad(nbytes, GGML_MEM_ALIGN)
        if end > self._limit:
            raise ContextFullError(
                f"not enough space in the context's memory pool for {what} "
                f"(needed {end - self._used} bytes, available {self._limit - self._used} of {self.mem_size})"
            )
        self._used = end
        return start

    # --- tensor creation ---

    def new_tensor_impl(self, type: GGMLType | int | str, ne: list[int] | tuple[int, ...],
                        view_src: Tensor | None = None, view_offs: int = 0) -> Tensor:
        """ggml_new_tensor_impl: a new tensor, or a view of `view_src` at `view_offs`."""
        type = as_type(type)
        ne = [int(n) for n in ne]
        if not 1 <= len(ne) <= GGML_MAX_DIMS:
            raise ArgumentError(f"a tensor has 1 to {GGML_MAX_DIMS} dimensions, got {len(ne)}")
        if any(n < 0 for n in ne):
            raise ArgumentError(f"negative dimension in ne={ne}")
        ne = ne + [1] * (GGML_MAX_DIMS - len(ne))
        tr = TYPE_TRAITS[type]
        if ne[0] % tr.blck_size != 0:
            raise ArgumentError(
                f"ne[0]={ne[0]} is not a multiple of the {tr.name} block size {tr.blck_size}"
            )
        if view_src is not None and view_src.view_src is not None:
            view_offs += view_src.view_offs
            view_src = view_src.view_src
        nb = default_strides(type, ne)
        data_size = nbytes_of(type, ne, nb)
        if view_src is not None and data_size + view_offs > view_src.nbytes():
            raise ArgumentError(
                f"view of {data_size} bytes at offset {view_offs} is outside '{view_src.name}' "
                f"({view_src.nbytes()} bytes)"
            )
        alloc_data = view_src is None and not self.no_alloc
        offs = self._take(tensor_overhead() + (data_size if alloc_data else 0), "a tensor")
        t = Tensor(self, type, ne, nb)
        t.view_src = view_src
        t.view_offs = view_offs
        if view_src is not None:
            if view_src.data is not None:
                t.data = view_src.data + view_offs
        elif alloc_data:
            assert self._base is not None
            t.data = self._base + offs + tensor_overhead()  # tensor_overhead() is a multiple of GGML_MEM_ALIGN
        self.tensors.append(t)
        return t

    def new_tensor(self, type: GGMLType | int | str, ne: list[int] | tuple[int, ...]) -> Tensor:
        return self.new_tensor_impl(type, ne)

    def new_tensor_1d(self, type: GGMLType | int | str, ne0: int) -> Tensor:
        return self.new_tensor_impl(type, [ne0])

    def new_tensor_2d(self, type: GGMLType | int | str, ne0: int, ne1: int) -> Tensor:
        return self.new_tensor_impl(type, [ne0, ne1])

    def new_tensor_3d(self, type: GGMLType | int | str, ne0: int, ne1: int, ne2: int) -> Tensor:
        return self.new_tensor_impl(type, [ne0, ne1, ne2])

    def new_tensor_4d(self, type: GGMLType | int | str, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
        return self.new_tensor_impl(type, [ne0, ne1, ne2, ne3])

    def new_i32(self, value: int) -> Tensor:
        t = self.new_tensor_1d(GGMLType.I32, 1)
        t.numpy()[...] = value
        return t

    def new_f32(self, value: float) -> Tensor:
        t = self.new_tensor_1d(GGMLType.F32, 1)
        t.numpy()[...] = value
        return t

    def dup_tensor(self, src: Tensor) -> Tensor:
        """A new tensor of the same type and shape (no data copied)."""
        return self.new_tensor_impl(src.type, src.ne)

    def view_tensor(self, src: Tensor) -> Tensor:
        """ggml_view_tensor: a view of all of `src` with its strides."""
        t = self.new_tensor_impl(src.type, src.ne, src, 0)
        t.format_name("%s (view)", src.name)
        t.nb = list(src.nb)
        return t

    # --- lookup and iteration ---

    def get_tensor(self, name: str) -> Tensor | None:
        for t in self.tensors:
            if t.name == name:
                return t
        return None

    def get_first_tensor(self) -> Tensor | None:
        return self.tensors[0] if self.tensors else None

    def get_next_tensor(self, t: Tensor) -> Tensor | None:
        i = self.tensors.index(t) + 1
        return self.tensors[i] if i < len(self.tensors) else None

    def __iter__(self) -> Iterator[Tensor]:
        return iter(list(self.tensors))

    # --- graphs ---

    def new_graph(self, size: int = GGML_DEFAULT_GRAPH_SIZE, grads: bool = False):  # noqa: ANN201
        """ggml_new_graph / ggml_new_graph_custom."""
        from pyggml.core.graph import Graph, graph_nbytes

        self._take(GGML_OBJECT_SIZE + pad(graph_nbytes(size, grads), GGML_MEM_ALIGN), "a graph")
        g = Graph(size)
        self.graphs.append(g)
        return g

    def graph_view(self, graph, i0: int, i1: int):  # noqa: ANN001, ANN201
        from pyggml.core.graph import GRAPH_STRUCT_SIZE

        view = graph.view(i0, i1)  # checks i0, i1 before the pool is touched
        self._take(GGML_OBJECT_SIZE + GRAPH_STRUCT_SIZE, "a graph view")
        return view
