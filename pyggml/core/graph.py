"""`Graph`: ggml's `ggml_cgraph`, nodes and leafs in ggml's build order."""

from __future__ import annotations

import bisect
import logging
from enum import IntEnum

from pyggml.core.checks import check_instance, check_int, check_size
from pyggml.core.errors import GraphError, InvalidStateError, OutOfBoundsError
from pyggml.core.tensor import GGML_MAX_SRC, GGMLOp, Tensor

log = logging.getLogger("pyggml.graph")

POINTER_SIZE = 8
INT32_SIZE = 4
GRAPH_STRUCT_SIZE = 96  # sizeof(struct ggml_cgraph) on a 64-bit host

# ggml_hash_size's table: the smallest of these primes >= the requested size
_PRIMES = [2, 3, 5, 11, 17, 37, 67, 131, 257, 521, 1031, 2053, 4099, 8209, 16411, 32771, 65537,
           131101, 262147, 524309, 1048583, 2097169, 4194319, 8388617, 16777259, 33554467,
           67108879, 134217757, 268435459, 536870923, 1073741827, 2147483659]


def hash_size(min_sz: int) -> int:
    """ggml_hash_size: the capacity of a hash set for at least `min_sz` keys."""
    i = bisect.bisect_left(_PRIMES, min_sz)
    return _PRIMES[i] if i < len(_PRIMES) else min_sz | 1


def _align(offset: int, alignment: int) -> int:
    return -(-offset // alignment) * alignment


def graph_nbytes(size: int, grads: bool) -> int:
    """ggml_graph_nbytes: the pool bytes of a graph of `size` nodes, each part aligned as incr_ptr_aligned."""
    n_hash = hash_size(size * 2)
    parts = [(size, POINTER_SIZE), (size, POINTER_SIZE), (n_hash, INT32_SIZE), (n_hash, POINTER_SIZE)]
    if grads:
        parts += [(n_hash, POINTER_SIZE), (n_hash, POINTER_SIZE)]
    parts.append(((n_hash + 31) // 32, INT32_SIZE))  # ggml_bitset_size words of ggml_bitset_t
    offset = GRAPH_STRUCT_SIZE
    for count, item in parts:
        offset = _align(offset, item) + count * item
    return offset


def graph_overhead(size: int = 2048, grads: bool = False) -> int:
    """ggml_graph_overhead / ggml_graph_overhead_custom."""
    from pyggml.core.context import GGML_MEM_ALIGN, GGML_OBJECT_SIZE, pad

    return GGML_OBJECT_SIZE + pad(graph_nbytes(size, grads), GGML_MEM_ALIGN)


class HashSet:
    """ggml's `ggml_hash_set`: a stable slot in [0, size) per tensor, by identity."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.keys: dict[int, int] = {}
        self._tensors: list[Tensor] = []  # keeps keys alive so ids stay unique

    def __contains__(self, t: object) -> bool:
        return id(t) in self.keys

    def __len__(self) -> int:
        return len(self.keys)

    def insert(self, t: Tensor) -> bool:
        """Add `t`; False if it was already there (GGML_HASHTABLE_ALREADY_EXISTS)."""
        if id(t) in self.keys:
            return False
        self.find_or_insert(t)
        return True

    def find_or_insert(self, t: Tensor) -> int:
        slot = self.keys.get(id(t))
        if slot is None:
            if len(self.keys) >= self.size:
                raise GraphError(f"hash set full: {self.size} tensors already, cannot add '{t.name}'")
            slot = len(self.keys)
            self.keys[id(t)] = slot
            self._tensors.append(t)
        return slot

    def reset(self) -> None:
        self.keys.clear()
        self._tensors.clear()

    def truncate(self, n: int) -> None:
        """Forget every key but the first `n` inserted."""
        for t in self._tensors[n:]:
            del self.keys[id(t)]
        del self._tensors[n:]


def _describe(t: Tensor) -> str:
    """'name' (OP) for messages; tensors are often unnamed when a graph is built."""
    return f"'{t.name}' ({t.op.name})"


class EvalOrder(IntEnum):
    LEFT_TO_RIGHT = 0
    RIGHT_TO_LEFT = 1


class Graph:
    """A compute graph: `nodes` (ops, in execution order) and `leafs` (constants, inputs)."""

    def __init__(self, size: int = 2048) -> None:
        size = check_size(size, "Graph: size")
        self.size = size
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self.visited_hash_table = HashSet(hash_size(size * 2))
        self.order = EvalOrder.LEFT_TO_RIGHT

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def n_leafs(self) -> int:
        return len(self.leafs)

    def node(self, i: int) -> Tensor:
        i = check_int(i, "graph_node: i")
        n = len(self.nodes)
        if not -n <= i < n:
            raise OutOfBoundsError(f"graph_node: node {i} is outside the graph's {n} nodes")
        return self.nodes[i]

    def clear(self) -> None:
        self.nodes.clear()
        self.leafs.clear()
        self.visited_hash_table.reset()

    def build_forward_expand(self, tensor: Tensor) -> None:
        """ggml_build_forward_expand; on overflow or a cycle everything this call added is taken back."""
        check_instance(tensor, Tensor, "build_forward_expand: tensor")
        n_nodes, n_leafs, n_visited = len(self.nodes), len(self.leafs), len(self.visited_hash_table)
        named: list[Tensor] = []
        try:
            self._visit_parents(tensor, named)
            if len(self.nodes) > n_nodes and self.nodes[-1] is not tensor:
                raise GraphError(f"build_forward_expand: '{tensor.name}' was not the last node added "
                                 f"(it is a leaf whose sources are ops)")
        except BaseException:
            del self.nodes[n_nodes:]
            del self.leafs[n_leafs:]
            self.visited_hash_table.truncate(n_visited)
            for t in named:
                t.name = ""
            raise

    def _visit_parents(self, root: Tensor, named: list[Tensor]) -> None:
        """ggml_visit_parents without recursion (graphs are deeper than Python's stack); a cycle raises."""
        visited = self.visited_hash_table
        if not visited.insert(root):
            return
        stack: list[tuple[Tensor, int]] = [(root, 0)]
        on_path: set[int] = {id(root)}
        reverse = self.order == EvalOrder.RIGHT_TO_LEFT
        while stack:
            t, i = stack[-1]
            pushed = False
            while i < GGML_MAX_SRC:
                k = GGML_MAX_SRC - 1 - i if reverse else i
                i += 1
                s = t.src[k]
                if s is None:
                    continue
                if id(s) in on_path:
                    self._raise_cycle(stack, s)
                if not isinstance(s, Tensor):
                    check_instance(s, Tensor, f"build_forward_expand: src[{k}] of '{t.name}'")
                if visited.insert(s):
                    stack[-1] = (t, i)
                    stack.append((s, 0))
                    on_path.add(id(s))
                    pushed = True
                    break
            if pushed:
                continue
            stack.pop()
            on_path.discard(id(t))
            self._append(t, named)

    @staticmethod
    def _raise_cycle(stack: list[tuple[Tensor, int]], s: Tensor) -> None:
        path = [t for t, _ in stack]
        start = next(j for j, t in enumerate(path) if t is s)
        chain = " -> ".join(_describe(t) for t in [*path[start:], s])
        raise InvalidStateError(f"build_forward_expand: the graph has a cycle of {len(path) - start} tensors: "
                                f"{_describe(s)} depends on itself ({chain})")

    def _append(self, t: Tensor, named: list[Tensor]) -> None:
        if t.op == GGMLOp.NONE and not t.is_param:
            if len(self.leafs) >= self.size:
                raise GraphError(f"graph full: {self.size} leafs, cannot add {_describe(t)} (use a larger graph size)")
            if not t.name:
                t.name = f"leaf_{len(self.leafs)}"
                named.append(t)
            self.leafs.append(t)
        else:
            if len(self.nodes) >= self.size:
                raise GraphError(f"graph full: {self.size} nodes, cannot add {_describe(t)} (use a larger graph size)")
            if not t.name:
                t.name = f"node_{len(self.nodes)}"
                named.append(t)
            self.nodes.append(t)

    def view(self, i0: int, i1: int) -> Graph:
        """ggml_graph_view: nodes i0..i1 of this graph, no leafs, no hash table."""
        i0, i1 = check_int(i0, "graph_view: i0"), check_int(i1, "graph_view: i1")
        if not 0 <= i0 <= i1 <= len(self.nodes):
            raise GraphError(f"graph_view: nodes [{i0}, {i1}) are not inside the graph's {len(self.nodes)} nodes")
        g = Graph.__new__(Graph)
        g.size = i1 - i0
        g.nodes = self.nodes[i0:i1]
        g.leafs = []
        g.visited_hash_table = HashSet(0)
        g.order = self.order
        return g

    def cpy(self, dst: Graph) -> None:
        """ggml_graph_cpy."""
        check_instance(dst, Graph, "graph_cpy: dst")
        if dst.size < len(self.nodes) or dst.size < len(self.leafs):
            raise GraphError(f"graph_cpy: destination of size {dst.size} cannot hold {len(self.nodes)} nodes "
                             f"and {len(self.leafs)} leafs")
        visited = HashSet(dst.visited_hash_table.size)  # filled first: a failure leaves dst as it was
        for t in self.nodes + self.leafs:
            visited.insert(t)
        dst.nodes = list(self.nodes)
        dst.leafs = list(self.leafs)
        dst.visited_hash_table = visited

    def get_tensor(self, name: str) -> Tensor | None:
        for t in self.leafs + self.nodes:
            if t.name == name:
                return t
        return None

    def format(self) -> str:
        """The text of ggml_graph_print."""
        lines = ["=== GRAPH ===", f"n_nodes = {self.n_nodes}"]
        for i, node in enumerate(self.nodes):
            ne = ", ".join(f"{n:5d}" for n in node.ne[:3])
            flag = "x" if node.is_param else " "
            lines.append(f" - {i:3d}: [ {ne}] {node.op.name:>16} {flag} {node.name}")
        lines.append(f"n_leafs = {self.n_leafs}")
        for i, leaf in enumerate(self.leafs):
            lines.append(f" - {i:3d}: [ {leaf.ne[0]:5d}, {leaf.ne[1]:5d}] {leaf.op.name:>8} {leaf.name:>16}")
        lines.append("========================================")
        return "\n".join(lines)

    def print(self) -> None:
        """ggml_graph_print, through logging (level INFO of 'pyggml.graph')."""
        log.info("%s", self.format())

    def dump_dot(self, filename: str | None = None, color_of: dict[int, str] | None = None) -> str:
        """ggml_graph_dump_dot; `color_of` maps id(tensor) to a fill colour."""
        from pyggml.core.dot import graph_to_dot

        text = graph_to_dot(self, color_of or {})
        if filename is not None:
            with open(filename, "w", encoding="utf-8") as f:
                f.write(text)
        return text

    def __repr__(self) -> str:
        return f"Graph(n_nodes={self.n_nodes}, n_leafs={self.n_leafs}, size={self.size})"
