"""`Context`: ggml's `ggml_context` (ggml.c), the pool tensors and graphs take room in (data too unless no_alloc)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from pyggml.core import memory
from pyggml.core.checks import check_instance, check_int, check_positive, check_real, check_size
from pyggml.core.errors import ArgumentError, ContextFullError, InvalidStateError, OutOfBoundsError, ShapeError
from pyggml.core.ops import OpBuilders
from pyggml.core.tensor import Tensor, check_ne, check_window, nbytes_of, strides
from pyggml.core.types import TYPE_TRAITS, GGMLType, as_type

if TYPE_CHECKING:
    from pyggml.core.graph import Graph

GGML_MEM_ALIGN = 16
GGML_OBJECT_SIZE = 32
GGML_TENSOR_SIZE = 336  # sizeof(struct ggml_tensor) on a 64-bit machine
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
        mem_size = check_size(mem_size, "Context: mem_size")
        self.mem_size = mem_size
        self.no_alloc = no_alloc
        self.tensors: list[Tensor] = []
        self.graphs: list[object] = []
        self._used = 0
        self._offs0 = 0  # bytes skipped to align the first object
        self._limit = mem_size
        self._arena: np.ndarray | None = None
        self._arena_owned = mem_buffer is None
        self._base: int | None = None
        self._by_name: dict[str, Tensor] = {}
        self._freed = False
        if mem_buffer is not None:
            arena = np.asarray(mem_buffer).reshape(-1).view(np.uint8)
            if arena.nbytes < mem_size:
                raise ArgumentError(f"mem_buffer holds {arena.nbytes} bytes, mem_size asks {mem_size}")
            self._arena = arena[:mem_size]
        elif not no_alloc and mem_size > 0:
            # checked first, so 1 PiB names the numbers rather than numpy's MemoryError
            self._arena = memory.allocate_host(mem_size + GGML_MEM_ALIGN, f"Context(mem_size={mem_size})")
        if self._arena is not None:
            self._base = memory.register(self._arena)
            self._offs0 = (-self._base) % GGML_MEM_ALIGN
            self._used = self._offs0
            if self._arena_owned:
                self._limit = mem_size + self._offs0

    def free(self) -> None:
        """ggml_free: release the arena (tensors lose their memory); freeing twice does nothing."""
        self._freed = True
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

    def mark(self) -> tuple[int, int]:
        """The pool's state (bytes used, tensors made), for `rollback`."""
        return self._used, len(self.tensors)

    def rollback(self, mark: tuple[int, int]) -> None:
        """Take back the tensors made since `mark` and their pool bytes (a failed op builder leaves nothing)."""
        used, n_tensors = mark
        if n_tensors <= len(self.tensors) and used <= self._used:
            del self.tensors[n_tensors:]
            self._used = used

    def _take(self, nbytes: int, what: str) -> int:
        """ggml_new_object: `nbytes` of the pool padded to GGML_MEM_ALIGN; returns its aligned arena offset."""
        if self._freed:
            raise InvalidStateError(f"cannot make {what} in a freed context (mem_size {self.mem_size})")
        start = self._used
        end = start + pad(nbytes, GGML_MEM_ALIGN)
        if end > self._limit:
            raise ContextFullError(
                f"not enough space in the context's memory pool for {what} "
                f"(needed {end - self._used} bytes, available {self._limit - self._used} of {self.mem_size})"
            )
        self._used = end
        return start

    def new_tensor_impl(self, type: GGMLType | int | str, ne: list[int] | tuple[int, ...],
                        view_src: Tensor | None = None, view_offs: int = 0, *,
                        nb: Sequence[int] = (), what: str = "new_tensor") -> Tensor:
        """ggml_new_tensor_impl: a new tensor, or a view of `view_src` at `view_offs` with strides `nb` (the rest
        as `strides` fills them); a view must lie inside its root, so no kernel writes outside a source."""
        type = as_type(type)
        ne = check_ne(ne, what)
        tr = TYPE_TRAITS[type]
        if ne[0] % tr.blck_size != 0:
            raise ShapeError(f"{what}: ne[0]={ne[0]} is not a multiple of the {tr.name} block size {tr.blck_size}")
        nb = strides(type, ne, nb)
        if view_src is not None:
            if not isinstance(view_src, Tensor):
                check_instance(view_src, Tensor, f"{what}: view_src")
            if view_offs.__class__ is not int:  # (`type` is shadowed)
                view_offs = check_int(view_offs, f"{what}: offset")
            if view_offs < 0:  # a size_t in ggml
                raise OutOfBoundsError(f"{what}: offset {view_offs} is negative: a view of '{view_src.name}' "
                                       f"({view_src.nbytes()} bytes) must start at offset >= 0")
            src = view_src
            if view_src.view_src is not None:  # views of views point into the root's memory, as in ggml
                view_offs += view_src.view_offs
                view_src = view_src.view_src
            where = what if src is view_src else f"{what} of '{src.name}' (at offset {src.view_offs} in its root)"
            check_window(where, type, ne, nb, view_offs, view_src)
        alloc_data = view_src is None and not self.no_alloc
        data_size = nbytes_of(type, ne, nb) if alloc_data else 0
        offs = self._take(tensor_overhead() + data_size, "a tensor")
        t = Tensor(self, type, ne, nb)
        t.view_src = view_src
        t.view_offs = view_offs
        if view_src is not None:
            if view_src.data is not None:
                t.data = view_src.data + view_offs
        elif alloc_data:
            assert self._base is not None
            t.data = self._base + offs + tensor_overhead()
        self.tensors.append(t)
        return t

    def new_tensor(self, type: GGMLType | int | str, ne: list[int] | tuple[int, ...]) -> Tensor:
        return self.new_tensor_impl(type, ne)

    def new_tensor_1d(self, type: GGMLType | int | str, ne0: int) -> Tensor:
        return self.new_tensor_impl(type, [ne0], what="new_tensor_1d")

    def new_tensor_2d(self, type: GGMLType | int | str, ne0: int, ne1: int) -> Tensor:
        return self.new_tensor_impl(type, [ne0, ne1], what="new_tensor_2d")

    def new_tensor_3d(self, type: GGMLType | int | str, ne0: int, ne1: int, ne2: int) -> Tensor:
        return self.new_tensor_impl(type, [ne0, ne1, ne2], what="new_tensor_3d")

    def new_tensor_4d(self, type: GGMLType | int | str, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
        return self.new_tensor_impl(type, [ne0, ne1, ne2, ne3], what="new_tensor_4d")

    def new_i32(self, value: int) -> Tensor:
        value = check_int(value, "new_i32: value", minimum=-(2**31), maximum=2**31 - 1)
        t = self.new_tensor_1d(GGMLType.I32, 1)
        t.numpy()[...] = value
        return t

    def new_f32(self, value: float) -> Tensor:
        value = check_real(value, "new_f32: value")
        t = self.new_tensor_1d(GGMLType.F32, 1)
        t.numpy()[...] = value
        return t

    def dup_tensor(self, src: Tensor) -> Tensor:
        check_instance(src, Tensor, "dup_tensor: src")
        return self.new_tensor_impl(src.type, src.ne, what="dup_tensor")

    def view_tensor(self, src: Tensor) -> Tensor:
        """ggml_view_tensor: a view of all of `src` with its strides."""
        check_instance(src, Tensor, "view_tensor: src")
        t = self.new_tensor_impl(src.type, src.ne, src, 0, nb=src.nb, what="view_tensor")
        t.format_name("%s (view)", src.name)
        return t

    def get_tensor(self, name: str) -> Tensor | None:
        for t in self.tensors:
            if t.name == name:
                return t
        return None

    def get_first_tensor(self) -> Tensor | None:
        return self.tensors[0] if self.tensors else None

    def get_next_tensor(self, t: Tensor) -> Tensor | None:
        if getattr(t, "ctx", None) is not self or t not in self.tensors:
            raise ArgumentError(f"get_next_tensor: tensor {getattr(t, 'name', t)!r} is not in this context")
        i = self.tensors.index(t) + 1
        return self.tensors[i] if i < len(self.tensors) else None

    def __iter__(self) -> Iterator[Tensor]:
        return iter(list(self.tensors))

    def new_graph(self, size: int = GGML_DEFAULT_GRAPH_SIZE, grads: bool = False) -> Graph:
        """ggml_new_graph / ggml_new_graph_custom: a graph of at most `size` nodes (and `size` leafs), size >= 1."""
        from pyggml.core.graph import Graph, graph_nbytes

        # ggml takes 0 too, but a graph of size 0 cannot hold the tensor it is built for
        size = check_positive(size, "new_graph: size")
        self._take(GGML_OBJECT_SIZE + pad(graph_nbytes(size, grads), GGML_MEM_ALIGN), "a graph")
        g = Graph(size)
        self.graphs.append(g)
        return g

    def graph_view(self, graph: Graph, i0: int, i1: int) -> Graph:
        from pyggml.core.graph import GRAPH_STRUCT_SIZE, Graph

        check_instance(graph, Graph, "graph_view: graph")
        view = graph.view(i0, i1)
        self._take(GGML_OBJECT_SIZE + GRAPH_STRUCT_SIZE, "a graph view")
        return view
