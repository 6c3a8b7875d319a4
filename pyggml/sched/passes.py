"""The passes of `ggml_backend_sched_split_graph` (ggml-backend.cpp at 0c1e570): assignment (1-4), splits (5, 6).

Causes ("1.wgt0", "2.sup", ...) are kept for the GGML_SCHED_DEBUG printout, as ggml's SET_CAUSE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyggml.core.errors import LimitExceededError, UnsupportedOpError
from pyggml.core.graph import Graph
from pyggml.core.tensor import GGML_MAX_SRC, VIEW_OPS, GGMLOp, Tensor, TensorFlag
from pyggml.ggml_backend.backend import op_desc
from pyggml.ggml_backend.buffer import BufferUsage

if TYPE_CHECKING:
    from pyggml.core.context import Context
    from pyggml.ggml_backend.buffer import Buffer
    from pyggml.ggml_backend.buffer_type import BufferType
    from pyggml.sched.backend_sched import BackendSched

GGML_MAX_SPLITS_LIMIT = 4096  # a graph cut more often than this is a mistake, not a plan


_COMPUTES_NOTHING = frozenset((GGMLOp.NONE, *VIEW_OPS))
_INPUT = int(TensorFlag.INPUT)
_NONE = GGMLOp.NONE


def dup_tensor_layout(ctx: Context, tensor: Tensor) -> Tensor:
    """ggml_dup_tensor_layout: a new tensor of the same type, `ne` and `nb` (a copy keeps the layout)."""
    dup = ctx.dup_tensor(tensor)
    dup.nb = list(tensor.nb)
    return dup


class Assigner:
    """The state of one split_graph call: supports_op answers are asked once per (backend, node)."""

    def __init__(self, sched: BackendSched) -> None:
        self.sched = sched
        self.ids = sched.backend_ids
        self.causes = sched.causes
        # keyed by id * 16 + backend: ints, not tuples, so the answers start no cyclic garbage collection
        self._supports: dict[int, bool] = {}
        self._bufts: dict[int, bool] = {}
        self._ask = [b.supports_op for b in sched.backends]
        self._buffer_backend: dict[int, int] = {}  # id(buffer): its first backend (for tensors computing nothing)
        # ggml asks every backend; one without the offload_op hook says no
        self.offloaders = [b for b, backend in enumerate(sched.backends) if backend.has_offload_op] \
            if sched.op_offload else []

    def bid(self, t: Tensor) -> int:
        return self.ids.get(id(t), -1)

    def set(self, t: Tensor, backend_id: int, cause: str) -> None:
        self.ids[id(t)] = backend_id
        self.causes[id(t)] = cause

    def supports_op(self, b: int, node: Tensor) -> bool:
        if node.op in _COMPUTES_NOTHING:
            return True
        key = id(node) * 16 + b
        ok = self._supports.get(key)
        if ok is None:
            ok = self._supports[key] = self._ask[b](node)
        return ok

    def supports_buffer(self, b: int, buffer: Buffer) -> bool:
        """ggml_backend_supports_buft(backends[b], buffer->buft); a buffer without a type: its own backend's."""
        buft = buffer.buft
        if buft is None:
            return buffer.backend is self.sched.backends[b]
        return self.supports_buft(b, buft)

    def supports_buft(self, b: int, buft: BufferType) -> bool:
        key = id(buft) * 16 + b
        ok = self._bufts.get(key)
        if ok is None:
            ok = self._bufts[key] = bool(self.sched.backends[b].supports_buft(buft))
        return ok

    def backend_from_buffer(self, t: Tensor, op: Tensor) -> int:
        """ggml_backend_sched_backend_from_buffer: the first backend that takes t's buffer and computes op."""
        buffer = t.view_src.buffer if t.view_src is not None else t.buffer
        if buffer is None:
            return -1
        if op.op in _COMPUTES_NOTHING:  # (weights: hundreds of tensors in a few buffers)
            b = self._buffer_backend.get(id(buffer))
            if b is None:
                b = self._buffer_backend[id(buffer)] = next(
                    (b for b in range(self.sched.n_backends) if self.supports_buffer(b, buffer)), -1)
            return b
        for b in range(self.sched.n_backends):
            if self.supports_buffer(b, buffer) and self.supports_op(b, op):
                return b
        return -1

    def buffer_supported(self, t: Tensor, b: int) -> bool:
        """ggml_backend_sched_buffer_supported: whether backend b can read t where it is (or will be)."""
        buffer = t.view_src.buffer if t.view_src is not None else t.buffer
        if buffer is not None:
            return self.supports_buffer(b, buffer)
        tb = self.bid(t)
        if tb == -1 and t.view_src is not None:
            tb = self.bid(t.view_src)
        if tb == -1:
            return False
        return self.supports_buft(b, self.sched.bufts[tb])

    def from_cur(self, t: Tensor) -> int:
        """ggml_backend_sched_backend_id_from_cur: the backend that t's memory, or its weights, call for."""
        sched = self.sched
        view_src = t.view_src
        buffer = view_src.buffer if view_src is not None else t.buffer
        if buffer is not None:
            b = self.backend_from_buffer(t, t)
            if b != -1:
                self.causes[id(t)] = "1.dst"
                return b
            if view_src is not None:
                b = self.backend_from_buffer(view_src, t)
                if b != -1:
                    self.causes[id(t)] = "1.vsrc"
                    return b
            raise UnsupportedOpError(f"tensor '{t.name}' ({op_desc(t)}) is in buffer '{buffer.name}', which none of "
                                     f"the scheduler's backends that can read it can compute the op in")
        if int(t.flags) & _INPUT:
            self.causes[id(t)] = "1.inp"
            return sched.n_backends - 1  # the last backend (ggml: assumed the CPU)
        # as ggml: ROPE's frequency factors and FLASH_ATTN_EXT's sinks do not decide the backend
        if t.op in (GGMLOp.ROPE, GGMLOp.FLASH_ATTN_EXT):
            return -1
        last = sched.n_backends - 1
        for i, src in enumerate(t.src):
            if src is None or src.buffer is None or src.buffer.usage != BufferUsage.WEIGHTS:
                continue
            b = self.backend_from_buffer(src, t)
            if self.offloaders and b == last and src.buffer.buft is not None and src.buffer.buft.is_host():
                for hb in self.offloaders:
                    if hb < b and self.supports_op(hb, t) and sched.backends[hb].offload_op(t):
                        self.causes[id(t)] = "1.off"
                        return hb
            self.causes[id(t)] = f"1.wgt{i}"
            return b
        return -1

    def set_if_supported(self, node: Tensor, b: int) -> bool:
        if self.supports_op(b, node):
            self.set(node, b, "2.sup")
            return True
        return False


def _expand(a: Assigner, nodes: list[Tensor], skip_last: bool) -> None:
    """One of pass 2's four sweeps: unassigned nodes take the last assignment seen (not the last backend's
    with `skip_last`) when that backend computes them."""
    last = a.sched.n_backends - 1
    cur = -1
    get = a.ids.get
    for node in nodes:
        b = get(id(node), -1)
        if b != -1:
            cur = -1 if skip_last and b == last else b
        elif cur != -1:
            a.set_if_supported(node, cur)


def assign_backends(sched: BackendSched, graph: Graph) -> Assigner:
    """Passes 1 to 4: every node and source gets a backend (user assignments are kept)."""
    a = Assigner(sched)
    ids, causes = a.ids, a.causes
    get = ids.get
    # pass 1: assign backends to ops with pre-allocated inputs
    nodes = graph.nodes
    weights = BufferUsage.WEIGHTS
    for t in (*graph.leafs, *nodes):
        if get(id(t), -1) != -1:
            continue
        if t.op == _NONE and t.buffer is not None and t.view_src is None:  # a leaf with memory: a weight
            b = a.backend_from_buffer(t, t)
            if b != -1:
                ids[id(t)] = b
                causes[id(t)] = "1.dst"
                continue
        if t.buffer is None and t.view_src is None and not t.flags:
            for src in t.src:
                if src is not None and src.buffer is not None and src.buffer.usage == weights:
                    break
            else:
                continue
        b = a.from_cur(t)
        if b != -1:
            ids[id(t)] = b

    # pass 2: expand assignments to adjacent nodes, first without the fallback's, then all; views are skipped
    computed = [node for node in nodes if node.op not in VIEW_OPS]
    backwards = computed[::-1]
    _expand(a, computed, skip_last=True)
    _expand(a, backwards, skip_last=True)
    _expand(a, computed, skip_last=False)
    _expand(a, backwards, skip_last=False)

    # pass 3: upgrade to higher prio backends of the same buffer type; unassigned: most inputs readable
    bufts = sched.bufts
    for node in computed:
        b = get(id(node), -1)
        if b == -1:
            best = -1
            for cand in range(sched.n_backends):
                if not a.supports_op(cand, node):
                    continue
                n_supported = 0
                for src in node.src:
                    if src is None:
                        continue
                    assigned = get(id(src), -1) != -1 or (src.view_src is not None
                                                          and get(id(src.view_src), -1) != -1)
                    if assigned and a.buffer_supported(src, cand):
                        n_supported += 1
                if n_supported > best:
                    best = n_supported
                    a.set(node, cand, "3.best")
        elif b > 0:
            for cand in range(b):
                if bufts[cand] is bufts[b] and a.supports_op(cand, node) and all(
                        src is None or a.buffer_supported(src, cand) for src in node.src):
                    a.set(node, cand, "3.upg")
                    break

    # pass 4: assign backends to remaining src from dst and view_src
    for node in nodes:
        cur = get(id(node), -1)
        if node.view_src is not None and cur == -1:
            cur = get(id(node.view_src), -1)
            a.set(node, cur, "4.vsrc")
        for src in node.src:
            if src is None or get(id(src), -1) != -1:
                continue
            if src.view_src is not None:
                ids[id(src)] = get(id(src.view_src), -1)
                causes[id(src)] = "4.vsrc"
            else:
                ids[id(src)] = cur
                causes[id(src)] = "4.cur"
        if cur == -1:
            for cand in range(sched.n_backends):
                if a.set_if_supported(node, cand):
                    cur = cand
                    break
        if cur == -1:
            names = ", ".join(f"'{b.name()}'" for b in sched.backends)
            raise UnsupportedOpError(f"none of the scheduler's backends ({names}) supports node "
                                     f"{sched.describe_node(node)}")
    # a node pinned by the caller must be computable where it was pinned
    for node in nodes:
        if a.causes.get(id(node)) == "usr" and not a.supports_op(a.bid(node), node):
            raise UnsupportedOpError(f"node {sched.describe_node(node)} was set to backend "
                                     f"'{sched.backends[a.bid(node)].name()}', which does not support it")
    return a


def split_graph(sched: BackendSched, graph: Graph, a: Assigner) -> None:
    """Pass 5 (and 6): the splits, the copies of their inputs, and the allocation graph."""
    from pyggml.sched.backend_sched import SchedSplit  # (an import cycle)

    ctx = sched.ctx
    assert ctx is not None
    nodes = graph.nodes
    splits: list[SchedSplit] = []
    sched.splits = splits
    rewired = sched._rewired
    n_copies = sched.n_copies
    get = a.ids.get
    first = next((get(id(node), -1) for node in nodes if node.op not in VIEW_OPS), 0)
    split = SchedSplit(sched, max(first, 0), 0)
    splits.append(split)
    cur = split.backend_id
    for i, node in enumerate(nodes):
        if node.op in VIEW_OPS:
            continue
        nb = get(id(node), -1)
        # a weight of an incompatible backend starts a split, so the previous weight copies' memory is reused
        need_new = False
        if nb == cur and split.inputs:
            for src in node.src:
                if src is not None and src.buffer is not None and src.buffer.usage == BufferUsage.WEIGHTS \
                        and get(id(src), -1) != cur and not a.buffer_supported(src, cur):
                    need_new = True
                    break
        if nb != cur or need_new:
            split.i_end = i
            if len(splits) >= GGML_MAX_SPLITS_LIMIT:
                raise LimitExceededError(f"the graph needs more than {GGML_MAX_SPLITS_LIMIT} splits (node {i} "
                                         f"{sched.describe_node(node)})")
            split = SchedSplit(sched, nb, i)
            splits.append(split)
            cur = nb
        for j, src in enumerate(node.src):
            if src is None:
                continue
            src_slot = id(src)
            sb = get(src_slot, -1)
            if sb != cur and not a.buffer_supported(src, cur):
                key = (src_slot, cur, 0)
                if key not in sched.copies:
                    backend = sched.backends[cur]
                    for c in range(n_copies):
                        cpy = dup_tensor_layout(ctx, src)
                        cpy.format_name("%s#%s#%d", backend.name(), src.name, c)
                        if n_copies > 1:
                            cpy.flags |= TensorFlag.INPUT | TensorFlag.OUTPUT
                        sched.copies[(src_slot, cur, c)] = cpy
                        a.set(cpy, cur, "4.cpy")
                    split.inputs.append(src)
                rewired.append((node, j, src))
                node.src[j] = sched.copies[(src_slot, cur, sched.cur_copy)]
    split.i_end = len(nodes)

    # the allocator's graph: each split's input copies (reading their source, kept until copied) ahead of its nodes
    first_allocs: list[tuple[Tensor, int]] = []
    graph_copy = Graph(len(nodes) + 2 * sum(len(s.inputs) for s in splits) + 1)
    copy_backends: list[int] = []
    for s in splits:
        s.graph = graph.view(s.i_start, s.i_end)
        for inp in s.inputs:
            cpy = sched.copies[(id(inp), s.backend_id, sched.cur_copy)]
            cpy.src[0] = inp
            graph_copy.nodes.append(cpy)
            copy_backends.append(s.backend_id)
        for node in nodes[s.i_start:s.i_end]:
            graph_copy.nodes.append(node)
            copy_backends.append(get(id(node), -1))
    kept = [(t, b) for (_, b, _), t in sched.copies.items()] if n_copies > 1 else []
    waited: set[int] = set()
    for leaf in graph.leafs:
        if not int(leaf.flags) & _INPUT:
            continue
        lb = a.bid(leaf)
        if n_copies == 1 or lb < 0:
            first_allocs.append((leaf, lb))
            continue
        if lb not in waited:
            # beyond ggml: an async backend reading inputs in place may still queue the batch n_copies back,
            # whose input places the caller overwrites next; ggml waits only before copying to another backend
            sched._sync_split(lb)
            waited.add(lb)
        # pass 6: a place per copy for each graph input, so the next batch's inputs go elsewhere
        for c in range(n_copies):
            if c == sched.cur_copy:
                t = leaf
            else:
                t = dup_tensor_layout(ctx, leaf)
                t.format_name("%s#%s#%d", sched.backends[lb].name(), leaf.name, c)
                t.flags |= TensorFlag.INPUT | TensorFlag.OUTPUT
                a.set(t, lb, "6.cpy")
            sched.copies[(id(leaf), lb, c)] = t
            first_allocs.append((t, lb))
    if n_copies > 1:
        first_allocs.extend(kept)
        # a last node reading every copy keeps them all (the allocator frees a tensor after its last reader)
        for k in range(0, len(kept), GGML_MAX_SRC):
            keep = ctx.view_tensor(kept[k][0])
            for s_i, (t, _) in enumerate(kept[k:k + GGML_MAX_SRC]):
                keep.src[s_i] = t
            graph_copy.nodes.append(keep)
            copy_backends.append(kept[k][1])
            a.ids[id(keep)] = kept[k][1]
    sched.graph = graph_copy
    sched.first_allocs = first_allocs
    sched.graph_copy_backends = copy_backends
