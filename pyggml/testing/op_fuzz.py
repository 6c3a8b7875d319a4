"""A random fuzz of the CPU kernels: every op with random shapes, strides, sources, types and op_params.

Graph `index` of seed `seed` is one node, made reproducibly from `(seed, index)` alone: an op drawn
uniformly among those the CPU backend has a kernel for, one of the op checker's nodes of that op
(`op_check.all_cases`) as its start, then a few mutations (op_params words set to extreme ints, NaN and
infinity bit patterns or negative values; a dimension or a stride changed, zero and overlapping strides
included; a type changed; a source dropped, added or repeated; a source made to share the node's memory;
tensors misaligned). Element counts and byte spans stay small: the fuzz looks for bounds, not for work.

Each graph is computed as the RPC server computes a client's (`graph_plan_create`, `graph_plan_compute`
on tensors placed by address in one buffer), in a worker process, so that a crash is observed, not
suffered. Every tensor's bytes sit between guard bytes, and the buffer sits inside a larger host array
with more guard bytes around it. The graph is computed twice, with two different guard patterns and the
same tensor bytes; a finding is:

- `crash`: the worker died of a signal while computing the graph;
- `hang`: no result within the time limit;
- `bare`: an exception that is not a GGMLError (from supports_op, planning or computing);
- `oob-write`: a byte outside the node's destination changed (a guard, a source, the host array);
- `oob-read`: the bytes of the tensors differ between the two guard patterns (the node read outside its
  tensors, or memory nothing wrote);
- `unstable`: the two computes did not end alike (one raised, the other not).

A graph that is refused with a GGMLError, or computed within its bytes, is no finding.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import resource
import selectors
import subprocess
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

import numpy as np

from pyggml.core.errors import GGMLError
from pyggml.core.tensor import GGML_MAX_OP_PARAMS, GGMLOp, Tensor, default_strides, is_view_op
from pyggml.core.types import TYPE_TRAITS, GGMLType
from pyggml.ggml_backend.buffer import tensor_span as buffer_tensor_span

FINDINGS = ("crash", "hang", "bare", "oob-write", "oob-read", "unstable")

MAX_ELEMENTS = 1 << 14  # elements of one tensor
MAX_SPAN = 1 << 18  # bytes one tensor spans
MAX_WORK = 1 << 24  # a node's work (pyggml.core.work.node_work): op_params that ask more are the budget's to refuse
OUTER_GUARD = 1 << 16  # guard bytes of the host array on each side of the buffer
ALIGN = 32
WORKER_MEMORY = 3 << 30  # address space a worker may add to what it has after start-up
N_WORDS = GGML_MAX_OP_PARAMS // 4

# int32 words that break arithmetic: extremes, NaN/inf float bits, small and negative values
EXTREME_WORDS = (0, 1, -1, 2, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 255, 256, 1023, 1024, 65535, 65536,
                 2**20, 2**30, 2**31 - 1, -(2**31), -2, -3, -16, -1082130432, 0x7FC00000, 0x7F800000,
                 -8388608, 0x3F800000, 0x7F7FFFFF, 0x00000001, -2147483647)
FLOAT_WORDS = tuple(int(np.array([v], np.float32).view(np.int32)[0]) for v in
                    (np.nan, np.inf, -np.inf, -1.0, -0.0, 0.5, 2.0, 1e-45, 3.4e38, -3.4e38, 1e30, 100.0, 1e-7))
FUZZ_TYPES = tuple(t for t in GGMLType if TYPE_TRAITS[t].blck_size > 0)
# sources a kernel writes besides dst (ggml's in-place optimizer steps update the moments)
WRITTEN_SOURCES: dict[GGMLOp, tuple[int, ...]] = {GGMLOp.OPT_STEP_ADAMW: (2, 3)}
# ops whose kernel calls a user's Python function: what that function touches is its own business
USER_FUNCTION_OPS = (GGMLOp.MAP_CUSTOM1, GGMLOp.MAP_CUSTOM2, GGMLOp.MAP_CUSTOM3, GGMLOp.CUSTOM)


@dataclass
class TensorSpec:
    """One tensor of a graph: its type and layout, and where its memory is (tensors of one `root` share
    memory, `offs` bytes from the root's first byte)."""

    type: int
    ne: list[int]
    nb: list[int]
    root: int
    offs: int = 0
    fill: str = "values"  # "values" (small valid numbers), "bytes" (random), "extreme" (huge ints)

    def span(self) -> tuple[int, int]:
        return tensor_span(GGMLType(self.type), self.ne, self.nb)

    def describe(self) -> str:
        name = TYPE_TRAITS[GGMLType(self.type)].name
        return f"{name} ne={self.ne} nb={self.nb} root={self.root}+{self.offs} {self.fill}"


@dataclass
class GraphSpec:
    """One graph of the fuzz: a node and its sources, how the node was made."""

    seed: int
    index: int
    op: int
    node: TensorSpec
    params: list[int]
    srcs: list[TensorSpec | None]
    n_threads: int = 1
    misalign: dict[int, int] = field(default_factory=dict)  # root -> bytes off ALIGN
    origin: str = ""
    mutations: list[str] = field(default_factory=list)

    def describe(self) -> str:
        words = ",".join(str(w) for w in self.params[:_last_used(self.params)])
        srcs = "; ".join(f"src{i} {s.describe()}" for i, s in enumerate(self.srcs) if s is not None)
        misalign = f" misalign={self.misalign}" if self.misalign else ""
        return (f"{GGMLOp(self.op).name} params=[{words}] dst {self.node.describe()}; {srcs}; "
                f"n_threads={self.n_threads}{misalign} (from {self.origin}; {', '.join(self.mutations) or 'as is'})")


def tensor_span(type: GGMLType, ne: list[int], nb: list[int]) -> tuple[int, int]:
    """The bytes [lo, hi) from a tensor's data that its elements occupy (the buffers' bounds rule)."""
    return buffer_tensor_span(Tensor(None, type, list(ne), list(nb)))


def _last_used(words: list[int]) -> int:
    used = [i for i, w in enumerate(words) if w != 0]
    return used[-1] + 1 if used else 0


# --- the seeds: the op checker's nodes ---


@dataclass
class Seed:
    label: str
    op: int
    node: TensorSpec
    params: list[int]
    srcs: list[TensorSpec | None]


def _root_of(t: Tensor) -> tuple[Tensor, int]:
    offs = 0
    while t.view_src is not None:
        offs += t.view_offs
        t = t.view_src
    return t, offs


def load_seeds() -> dict[int, list[Seed]]:
    """The op checker's nodes by op (every op with a CPU kernel has at least one), user functions left out."""
    from pyggml.core.context import Context
    from pyggml.testing import op_check

    seeds: dict[int, list[Seed]] = {}
    for case in op_check.all_cases():
        ctx = Context(mem_size=1 << 22, no_alloc=True)
        try:
            graph, _ = op_check._graph_of(case, ctx)
        except op_check.MissingBuilder:
            continue
        for node in graph.nodes:
            if node.op == GGMLOp.NONE or is_view_op(node.op) or node.op in USER_FUNCTION_OPS:
                continue
            roots: dict[int, int] = {}

            def spec(t: Tensor, roots: dict[int, int] = roots) -> TensorSpec:
                root, offs = _root_of(t)
                rid = roots.setdefault(id(root), len(roots))
                return TensorSpec(int(t.type), list(t.ne), list(t.nb), rid, offs)

            node_spec = spec(node)
            srcs = [spec(s) if s is not None else None for s in node.src]
            seeds.setdefault(int(node.op), []).append(
                Seed(f"{case.label}({case.desc})", int(node.op), node_spec, [int(w) for w in node.op_params], srcs))
    return seeds


# --- mutations ---


def _tensors(spec: GraphSpec) -> list[TensorSpec]:
    return [spec.node, *(s for s in spec.srcs if s is not None)]


def _contiguous(t: TensorSpec) -> None:
    t.nb = default_strides(GGMLType(t.type), t.ne)


@dataclass(frozen=True)
class Limits:
    """How large a mutated graph may be: the fuzz's sizes, or the seed graph's where those are larger."""

    elements: int = MAX_ELEMENTS
    span: int = MAX_SPAN
    work: int = MAX_WORK

    @staticmethod
    def of(spec: GraphSpec) -> Limits:
        tensors = _tensors(spec)
        return Limits(max(MAX_ELEMENTS, *(math.prod(t.ne) for t in tensors)),
                      max(MAX_SPAN, *(t.span()[1] - t.span()[0] for t in tensors)),
                      max(MAX_WORK, node_work_of(spec)))


def _fits(spec: GraphSpec, limits: Limits) -> bool:
    """Every tensor within the limits, and a whole number of blocks per row (the RPC server refuses others)."""
    for t in _tensors(spec):
        tr = TYPE_TRAITS[GGMLType(t.type)]
        if min(t.ne) < 0 or t.ne[0] % tr.blck_size or min(t.nb) < 0:
            return False
        if math.prod(t.ne) > limits.elements:
            return False
        lo, hi = t.span()
        if hi - lo > limits.span:
            return False
    return node_work_of(spec) <= limits.work


def _pick_tensor(rng: np.random.Generator, spec: GraphSpec) -> tuple[str, TensorSpec]:
    srcs = [(f"src{i}", s) for i, s in enumerate(spec.srcs) if s is not None]
    if not srcs or rng.random() < 0.35:
        return "dst", spec.node
    return srcs[int(rng.integers(len(srcs)))]


def _new_ne(rng: np.random.Generator, n: int, blck: int) -> int:
    choices = [0, 1, 2, 3, n + 1, max(n - 1, 0), n * 2, n // 2, int(rng.integers(1, 65)), blck, 2 * blck, n + blck]
    return int(choices[int(rng.integers(len(choices)))])


def _mutate_params(rng: np.random.Generator, spec: GraphSpec) -> str:
    used = max(_last_used(spec.params), 1)
    j = int(rng.integers(min(used + 1, N_WORDS))) if rng.random() < 0.75 else int(rng.integers(N_WORDS))
    r = rng.random()
    if r < 0.4:
        w = EXTREME_WORDS[int(rng.integers(len(EXTREME_WORDS)))]
    elif r < 0.65:
        w = int(rng.integers(-4, 65))
    elif r < 0.85:
        w = FLOAT_WORDS[int(rng.integers(len(FLOAT_WORDS)))]
    else:
        w = int(rng.integers(-(2**31), 2**31))
    spec.params[j] = int(np.int32(np.int64(w).astype(np.int32)))
    return f"param{j}={spec.params[j]}"


def _mutate_ne(rng: np.random.Generator, spec: GraphSpec) -> str:
    name, t = _pick_tensor(rng, spec)
    d = int(rng.integers(4))
    blck = TYPE_TRAITS[GGMLType(t.type)].blck_size
    t.ne[d] = _new_ne(rng, t.ne[d], blck)
    if d == 0 and t.ne[0] % blck:
        t.ne[0] = (t.ne[0] // blck + 1) * blck
    keep = rng.random() < 0.35
    if not keep:
        _contiguous(t)
    return f"{name}.ne{d}={t.ne[d]}{' (nb kept)' if keep else ''}"


def _mutate_nb(rng: np.random.Generator, spec: GraphSpec) -> str:
    name, t = _pick_tensor(rng, spec)
    ts = TYPE_TRAITS[GGMLType(t.type)].type_size
    d = int(rng.integers(4))
    r = rng.random()
    if r < 0.25:
        t.nb[d] = 0
    elif r < 0.4 and d > 0:
        t.nb[d] = t.nb[d - 1]  # overlapping rows
    elif r < 0.5:
        e = int(rng.integers(4))
        t.nb[d], t.nb[e] = t.nb[e], t.nb[d]
    elif r < 0.6:
        t.nb[d] = max(t.nb[d] - ts, 0)
    elif r < 0.7:
        t.nb[d] = t.nb[d] * 2 + ts
    elif r < 0.8:
        t.nb[d] = int(rng.integers(1, 2 * ts + 1))  # a part of an element
    else:
        t.nb[d] = ts * int(rng.integers(0, 64))
    return f"{name}.nb{d}={t.nb[d]}"


def _mutate_type(rng: np.random.Generator, spec: GraphSpec) -> str:
    name, t = _pick_tensor(rng, spec)
    common = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32, GGMLType.Q8_0, GGMLType.Q4_0)
    pool = common if rng.random() < 0.6 else FUZZ_TYPES
    t.type = int(pool[int(rng.integers(len(pool)))])
    blck = TYPE_TRAITS[GGMLType(t.type)].blck_size
    if t.ne[0] % blck:
        t.ne[0] = max(blck, t.ne[0] // blck * blck)
    if rng.random() < 0.8:
        _contiguous(t)
    return f"{name}.type={TYPE_TRAITS[GGMLType(t.type)].name}"


def _random_tensor(rng: np.random.Generator, spec: GraphSpec) -> TensorSpec:
    type_ = (GGMLType.F32, GGMLType.F16, GGMLType.I32, GGMLType.Q8_0)[int(rng.integers(4))]
    blck = TYPE_TRAITS[type_].blck_size
    ne = [int(x) for x in rng.integers(1, 9, 4)]
    ne[0] *= blck
    t = TensorSpec(int(type_), ne, [], 1 + max(x.root for x in _tensors(spec)))
    _contiguous(t)
    return t


def _mutate_src(rng: np.random.Generator, spec: GraphSpec) -> str:
    present = [i for i, s in enumerate(spec.srcs) if s is not None]
    r = rng.random()
    if r < 0.35 and present:
        i = present[int(rng.integers(len(present)))]
        spec.srcs[i] = None
        return f"src{i} dropped"
    if r < 0.6 and present:
        i, j = int(rng.integers(6)), present[int(rng.integers(len(present)))]
        spec.srcs[i] = spec.srcs[j]
        return f"src{i}=src{j}"
    i = int(rng.integers(6))
    spec.srcs[i] = _random_tensor(rng, spec)
    return f"src{i} new"


def _mutate_alias(rng: np.random.Generator, spec: GraphSpec) -> str:
    present = [i for i, s in enumerate(spec.srcs) if s is not None]
    if not present:
        return "no alias"
    i = present[int(rng.integers(len(present)))]
    src = spec.srcs[i]
    assert src is not None
    if rng.random() < 0.5:
        spec.srcs[i] = src = copy.copy(src)
        src.root, src.offs = spec.node.root, 0
        return f"src{i} in dst's memory"
    spec.node.root, spec.node.offs = src.root, src.offs
    return f"dst in src{i}'s memory"


def _mutate_fill(rng: np.random.Generator, spec: GraphSpec) -> str:
    name, t = _pick_tensor(rng, spec)
    t.fill = ("bytes", "extreme")[int(rng.integers(2))]
    return f"{name} {t.fill}"


def _mutate_misalign(rng: np.random.Generator, spec: GraphSpec) -> str:
    name, t = _pick_tensor(rng, spec)
    spec.misalign[t.root] = int((1, 2, 4, 8, 16)[int(rng.integers(5))])
    return f"{name} misaligned by {spec.misalign[t.root]}"


def _mutate_op(rng: np.random.Generator, spec: GraphSpec, ops: list[int]) -> str:
    spec.op = ops[int(rng.integers(len(ops)))]
    return f"op={GGMLOp(spec.op).name}"


MUTATIONS: tuple[tuple[float, Callable[[np.random.Generator, GraphSpec], str]], ...] = (
    (0.32, _mutate_params), (0.15, _mutate_ne), (0.17, _mutate_nb), (0.1, _mutate_type), (0.1, _mutate_src),
    (0.07, _mutate_alias), (0.06, _mutate_fill), (0.03, _mutate_misalign))


def make_spec(seeds: dict[int, list[Seed]], seed: int, index: int) -> GraphSpec:
    """Graph `index` of `seed` (the same graph for the same seeds, seed and index)."""
    rng = np.random.default_rng([seed, index])
    ops = sorted(seeds)
    op = ops[int(rng.integers(len(ops)))]
    pool = seeds[op]
    s = pool[int(rng.integers(len(pool)))]
    spec = GraphSpec(seed, index, op, copy.deepcopy(s.node), list(s.params), copy.deepcopy(s.srcs),
                     n_threads=1 if rng.random() < 0.75 else 2, origin=s.label)
    n = int((0, 1, 1, 2, 2, 3, 4, 6)[int(rng.integers(8))])
    weights = np.array([w for w, _ in MUTATIONS])
    limits = Limits.of(spec)
    for _ in range(n):
        for _attempt in range(8):
            trial = copy.deepcopy(spec)
            if rng.random() < 0.03:
                what = _mutate_op(rng, trial, ops)
            else:
                fn = MUTATIONS[int(rng.choice(len(MUTATIONS), p=weights / weights.sum()))][1]
                what = fn(rng, trial)
            if _fits(trial, limits):
                trial.mutations.append(what)
                spec = trial
                break
    return spec


# --- placing and computing one graph ---


@dataclass
class Layout:
    size: int  # bytes of the host array
    buffer: tuple[int, int]  # the buffer's first byte and size in it
    data: dict[int, int]  # id of a TensorSpec -> offset of its data in the host array
    spans: dict[int, tuple[int, int]]  # id of a TensorSpec -> its bytes [lo, hi) in the host array
    guard: np.ndarray  # True where a byte belongs to no tensor


def place(spec: GraphSpec, rng: np.random.Generator) -> Layout:
    """Each root's tensors in one region, regions apart by guard bytes, the buffer inside guard bytes."""
    tensors = {id(t): t for t in _tensors(spec)}
    reach: dict[int, tuple[int, int]] = {}
    for t in tensors.values():
        lo, hi = t.span()
        a, b = reach.get(t.root, (t.offs + lo, t.offs + hi))
        reach[t.root] = (min(a, t.offs + lo), max(b, t.offs + hi))
    pos = OUTER_GUARD
    start: dict[int, int] = {}
    for root in sorted(reach):
        pos += int(rng.integers(16, 257))
        pos = -(-pos // ALIGN) * ALIGN + spec.misalign.get(root, 0)
        start[root] = pos
        pos += reach[root][1] - reach[root][0]
    pos += int(rng.integers(16, 257))
    buffer = (OUTER_GUARD, pos - OUTER_GUARD)
    size = pos + OUTER_GUARD
    data, spans = {}, {}
    guard = np.ones(size, bool)
    for key, t in tensors.items():
        data[key] = start[t.root] - reach[t.root][0] + t.offs
        lo, hi = t.span()
        spans[key] = (data[key] + lo, data[key] + hi)
        guard[data[key] + lo: data[key] + hi] = False
    return Layout(size, buffer, data, spans, guard)


_INT_DTYPES = {GGMLType.I8: np.int8, GGMLType.I16: np.int16, GGMLType.I32: np.int32, GGMLType.I64: np.int64}
_FLOAT_DTYPES = {GGMLType.F16: np.float16, GGMLType.F64: np.float64}


def _values(rng: np.random.Generator, t: TensorSpec, nbytes: int) -> np.ndarray:
    """`nbytes` of initial bytes for a region whose first tensor is `t`: small numbers of its type (indices
    from 0 to a few, floats within +-3), huge ints, NaN and infinities (`extreme`), or random bytes."""
    type_ = GGMLType(t.type)
    if t.fill == "bytes" or TYPE_TRAITS[type_].is_quantized:
        return rng.integers(0, 256, nbytes, dtype=np.uint8)
    n = nbytes // TYPE_TRAITS[type_].type_size + 1
    if type_ in _INT_DTYPES:
        if t.fill == "extreme":
            ints = rng.choice(np.array(EXTREME_WORDS, np.int64), n)
        else:
            ints = rng.integers(0, int((2, 4, 8, 64)[int(rng.integers(4))]), n)
        raw = ints.astype(_INT_DTYPES[type_]).view(np.uint8)
    else:
        v = rng.uniform(-3.0, 3.0, n).astype(np.float32)
        if t.fill == "extreme":
            v[rng.random(n) < 0.2] = np.nan
            v[rng.random(n) < 0.2] = np.inf
        if type_ == GGMLType.BF16:
            raw = (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        else:
            raw = v.astype(_FLOAT_DTYPES.get(type_, np.float32)).view(np.uint8)
    return raw[:nbytes].copy()


@dataclass
class Outcome:
    status: str  # "computed", "refused", or one of FINDINGS
    where: str = ""  # "supports", "plan", "compute"
    exc: str = ""
    message: str = ""
    frame: str = ""  # the innermost pyggml frame of a bare exception
    supported: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in ("", None)}


def _innermost_frame(e: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "pyggml" in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    return f"{f.filename.split('pyggml/', 1)[-1]}:{f.lineno} {f.name}"


def _error(e: BaseException, where: str) -> Outcome:
    status = "refused" if isinstance(e, GGMLError) else "bare"
    return Outcome(status, where, type(e).__name__, str(e)[:400], _innermost_frame(e) if status == "bare" else "")


def build_node(spec: GraphSpec) -> tuple[Tensor, dict[int, Tensor]]:
    """The spec's node with its sources, as tensors without memory (a TensorSpec used twice is one tensor),
    and the tensors by the id of their TensorSpec."""
    made: dict[int, Tensor] = {}

    def tensor(t: TensorSpec, name: str) -> Tensor:
        x = made.get(id(t))
        if x is None:
            x = made[id(t)] = Tensor(None, GGMLType(t.type), list(t.ne), list(t.nb))
            x.name = name
        return x

    node = tensor(spec.node, "dst")
    node.op = GGMLOp(spec.op)
    node.op_params[:] = np.array(spec.params, np.int64).astype(np.int32)
    for i, s in enumerate(spec.srcs):
        node.src[i] = tensor(s, f"src{i}") if s is not None else None
    return node, made


def node_work_of(spec: GraphSpec) -> int:
    """The work of the spec's node as the RPC server's budget counts it (0 where its op_params are no valid
    enum: the kernel refuses those)."""
    from pyggml.core.work import node_work

    try:
        return node_work(build_node(spec)[0])
    except GGMLError:
        return 0


@dataclass
class Placed:
    """A spec's node with its tensors in a buffer inside a guarded host array, and the bytes to compute from."""

    node: Tensor
    arena: np.ndarray  # the host array the buffer is in
    data: np.ndarray  # the tensors' initial bytes, at their places in the arena
    patterns: list[np.ndarray]  # two guard patterns
    guard: np.ndarray  # True where no tensor is
    writable: np.ndarray  # True where the node may write (dst; the sources an op updates)


BATCH_INVARIANT_ENV = "PYGGML_FUZZ_BATCH_INVARIANT"  # "1": the workers' backend is batch-invariant


class Runner:
    """Computes graph specs on one CPU backend (a worker's)."""

    def __init__(self) -> None:
        from pyggml.backends.cpu import cpu_init
        from pyggml.ggml_backend.registry import set_batch_invariant

        self.backend = cpu_init(1)
        if os.environ.get(BATCH_INVARIANT_ENV) == "1":  # the kernels pyggml serve computes with
            set_batch_invariant(self.backend, True)

    @contextlib.contextmanager
    def placed(self, spec: GraphSpec) -> Iterator[Placed]:
        """The spec's node placed (see `place`) in a CPU buffer of this runner's backend, for the `with` block."""
        from pyggml.backends.cpu.buffer import cpu_buffer_from_ptr
        from pyggml.core import memory

        rng = np.random.default_rng([spec.seed, spec.index, 1])
        layout = place(spec, rng)
        arena = np.empty(layout.size, np.uint8)
        tensors = {id(t): t for t in _tensors(spec)}
        data = np.zeros(layout.size, np.uint8)
        for t in tensors.values():  # every region's bytes (shared regions: the first tensor's kind)
            lo, hi = layout.spans[id(t)]
            if hi > lo and not data[lo:hi].any():
                data[lo:hi] = _values(rng, t, hi - lo)
        patterns = [rng.integers(0, 256, layout.size, dtype=np.uint8) for _ in range(2)]
        writable = np.zeros(layout.size, bool)
        for t in [spec.node, *(spec.srcs[i] for i in WRITTEN_SOURCES.get(GGMLOp(spec.op), ())
                               if i < len(spec.srcs) and spec.srcs[i] is not None)]:
            assert t is not None
            lo, hi = layout.spans[id(t)]
            writable[lo:hi] = True
        outer = cpu_buffer_from_ptr(None, arena, layout.size)
        start, size = layout.buffer
        buffer = cpu_buffer_from_ptr(self.backend, outer.get_base() + start, size)
        node, made = build_node(spec)
        for key, x in made.items():
            x.data, x.buffer = outer.get_base() + layout.data[key], buffer
        self.backend.n_threads = spec.n_threads
        try:
            yield Placed(node, arena, data, patterns, layout.guard, writable)
        finally:
            buffer.free()
            outer.free()
            memory.unregister(arena)

    def run(self, spec: GraphSpec) -> Outcome:
        """Compute the spec's graph twice, one guard pattern each, and say what happened (see the module doc)."""
        with self.placed(spec) as p:
            return self._compute(p.node, p.arena, p.data, p.patterns, p.guard, p.writable)

    def _compute(self, node: Tensor, arena: np.ndarray, data: np.ndarray, patterns: list[np.ndarray],
                 guard: np.ndarray, writable: np.ndarray) -> Outcome:
        from pyggml.core.graph import Graph

        supported: bool | None = None
        try:
            supported = bool(self.backend.supports_op(node))
        except Exception as e:
            if not isinstance(e, GGMLError):
                return _error(e, "supports")
        graph = Graph(1)
        graph.nodes = [node]
        try:
            plan = self.backend.graph_plan_create(graph)
        except Exception as e:
            out = _error(e, "plan")
            out.supported = supported
            return out
        results: list[np.ndarray] = []
        errors: list[Outcome | None] = []
        try:
            for pattern in patterns:
                np.copyto(arena, pattern)
                np.copyto(arena, data, where=~guard)
                before = arena.copy()
                try:
                    self.backend.graph_plan_compute(plan)
                    errors.append(None)
                except Exception as e:
                    errors.append(_error(e, "compute"))
                changed = np.flatnonzero((arena != before) & ~writable)
                if changed.size:
                    return Outcome("oob-write", "compute", message=f"{changed.size} bytes outside dst changed, "
                                   f"the first at byte {int(changed[0])} of {arena.size}", supported=supported)
                results.append(arena[~guard].copy())
        finally:
            self.backend.graph_plan_free(plan)
        first, second = errors
        if first is not None or second is not None:
            if first is None or second is None or first.exc != second.exc:
                return Outcome("unstable", "compute", message=f"{first} then {second}", supported=supported)
            first.supported = supported
            return first
        differ = np.flatnonzero(results[0] != results[1])
        if differ.size:
            return Outcome("oob-read", "compute", message=f"{differ.size} bytes of the tensors differ between the "
                           f"two guard patterns", supported=supported)
        return Outcome("computed", supported=supported)


# --- the worker and the parent ---


def _limit_memory() -> None:
    """Keep a worker's address space near what it uses: an absurd allocation fails instead of the machine."""
    with open("/proc/self/statm") as f:
        vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = vm + WORKER_MEMORY
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def worker(seed: int, start: int, stop: int) -> None:
    """Compute graphs start..stop-1 of `seed`, a line before (`{"start": i}`) and after each (its outcome), on
    the standard output; what anything else prints there (BLAS's complaints) goes to the standard error."""
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    warnings.simplefilter("ignore")  # overflow and invalid values are the fuzz's daily bread
    seeds = load_seeds()
    runner = Runner()
    _limit_memory()
    for i in range(start, stop):
        out.write(json.dumps({"start": i}) + "\n")
        out.flush()
        spec: GraphSpec | None = None
        try:
            spec = make_spec(seeds, seed, i)
            outcome = runner.run(spec)
        except Exception as e:  # the harness's own failure: a finding all the same
            outcome = _error(e, "harness")
            outcome.status = "bare"
        line = {"i": i, "op": GGMLOp(spec.op).name if spec is not None else "?", **outcome.as_dict()}
        if outcome.status in FINDINGS and spec is not None:
            line["spec"] = spec.describe()
        out.write(json.dumps(line) + "\n")
        out.flush()


@dataclass
class Summary:
    seed: int
    graphs: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    computed_by_op: Counter[str] = field(default_factory=Counter)
    graphs_by_op: Counter[str] = field(default_factory=Counter)
    findings: list[dict[str, Any]] = field(default_factory=list)

    def add(self, line: dict[str, Any]) -> None:
        self.graphs += 1
        self.statuses[line["status"]] += 1
        op = line.get("op", "?")
        self.graphs_by_op[op] += 1
        if line["status"] == "computed":
            self.computed_by_op[op] += 1
        if line["status"] in FINDINGS:
            self.findings.append(line)

    def groups(self) -> list[tuple[tuple[str, ...], list[dict[str, Any]]]]:
        """Findings grouped by kind, op, exception and frame (one line each in the report)."""
        by: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for f in self.findings:
            key = (f["status"], f.get("op", "?"), f.get("exc", ""), f.get("frame", ""))
            by.setdefault(key, []).append(f)
        return sorted(by.items(), key=lambda kv: -len(kv[1]))

    def report(self, out: TextIO) -> None:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.statuses.items()))
        out.write(f"seed {self.seed}: {self.graphs} graphs ({counts})\n")
        n_ops = len(self.graphs_by_op)
        never = sorted(op for op in self.graphs_by_op if not self.computed_by_op[op])
        out.write(f"ops: {n_ops} fuzzed, {n_ops - len(never)} computed at least once"
                  + (f" (never computed: {', '.join(never)})" if never else "") + "\n")
        findings = sum(1 for _ in self.findings)
        out.write(f"findings: {findings}\n")
        for (status, op, exc, frame), items in self.groups():
            f = items[0]
            out.write(f"  {len(items)} x {status} {op} {exc} {frame}\n")
            out.write(f"    first: graph {f['i']}: {f.get('message', '')[:300]}\n")
            out.write(f"    {f.get('spec', '')}\n")


def _spawn(seed: int, start: int, stop: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "pyggml.testing.op_fuzz", "--worker", "--seed", str(seed), "--start", str(start),
           "--stop", str(stop)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def _chunks(start: int, count: int, jobs: int) -> list[tuple[int, int]]:
    step = -(-count // jobs)
    return [(a, min(a + step, start + count)) for a in range(start, start + count, step)]


@dataclass
class _Worker:
    """A worker process, the graphs left to it, the graph it is on and its output not yet a whole line."""

    proc: subprocess.Popen[bytes]
    stop: int
    current: int | None = None
    since: float = 0.0
    pending: bytes = b""


def run_fuzz(seed: int, count: int, start: int = 0, jobs: int = 2, timeout: float = 60.0,
             progress: Callable[[Summary], None] | None = None, progress_every: int = 1000) -> Summary:
    """Graphs start..start+count-1 of `seed` over `jobs` worker processes; a worker that dies or stalls is
    replaced after the graph it was on (recorded as a crash or a hang)."""
    summary = Summary(seed)
    sel = selectors.DefaultSelector()
    workers: dict[int, _Worker] = {}  # by pid
    reported = [0]

    def tick() -> None:
        if progress is not None and summary.graphs - reported[0] >= progress_every:
            reported[0] = summary.graphs
            progress(summary)

    def launch(a: int, b: int) -> None:
        if a < b:
            proc = _spawn(seed, a, b)
            assert proc.stdout is not None
            workers[proc.pid] = _Worker(proc, b, since=time.monotonic())
            sel.register(proc.stdout, selectors.EVENT_READ, proc.pid)

    def retire(w: _Worker, status: str, message: str) -> None:
        """Forget a worker that ended or was killed; the graph it was on is a finding, the rest go to a new one."""
        assert w.proc.stdout is not None
        sel.unregister(w.proc.stdout)
        w.proc.stdout.close()
        del workers[w.proc.pid]
        if w.current is not None:
            spec = make_spec(_seeds(), seed, w.current)
            summary.add({"i": w.current, "status": status, "message": message, "op": GGMLOp(spec.op).name,
                         "spec": spec.describe()})
            launch(w.current + 1, w.stop)
            tick()

    for a, b in _chunks(start, count, jobs):
        launch(a, b)
    while workers:
        for key, _ in sel.select(timeout=1.0):
            w = workers[key.data]
            chunk = os.read(key.fd, 1 << 16)
            if not chunk:
                rc = w.proc.wait()
                retire(w, "crash", f"the worker ended with {f'signal {-rc}' if rc < 0 else f'status {rc}'}")
                continue
            *lines, w.pending = (w.pending + chunk).split(b"\n")
            for line in lines:
                msg = json.loads(line)
                if "start" in msg:
                    w.current, w.since = msg["start"], time.monotonic()
                else:
                    w.current = None
                    summary.add(msg)
                    tick()
        now = time.monotonic()
        for w in list(workers.values()):
            if w.current is not None and now - w.since > timeout:
                w.proc.kill()
                w.proc.wait()
                retire(w, "hang", f"no result within {timeout:g} s")
    if progress is not None:
        progress(summary)
    return summary


_SEEDS: dict[int, list[Seed]] | None = None


def _seeds() -> dict[int, list[Seed]]:
    global _SEEDS
    if _SEEDS is None:
        _SEEDS = load_seeds()
    return _SEEDS


def replay(seed: int, index: int) -> tuple[GraphSpec, Outcome]:
    """Graph `index` of `seed` computed in this process (to reproduce a finding under a debugger)."""
    spec = make_spec(_seeds(), seed, index)
    return spec, Runner().run(spec)


def _main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--stop", type=int, default=0)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.seed, args.start, args.stop)


if __name__ == "__main__":
    _main()
