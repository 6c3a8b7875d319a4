"""A run of a plan's nodes computed by the kernel threads in one native call, node after node with a barrier between,
as ggml_graph_compute_thread: each node's job form is its steps, each step a compiled job by address and its
descriptor (DESIGN.md, "The graph runner")."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from pyggml.backends.cpu.jit import compiled_address
from pyggml.backends.cpu.kernels import Compute
from pyggml.backends.cpu.kernels.atomics import (
    address,
    atomic_add,
    atomic_load,
    atomic_store,
    cycle_counter,
    pointer_f32,
    pointer_i8,
    pointer_i32,
    pointer_i64,
    pointer_u16,
    spin_pause,
    yield_cpu,
)
from pyggml.backends.cpu.kernels.threads import (
    LEAD_SLOTS,
    LEAD_SLOTS_AT,
    LEAD_SPINS,
    N_THREADS,
    SLOT_LEN,
    YIELD_POLLS,
    WorkerPool,
    call_job,
    post,
    revoke,
)
from pyggml.backends.cpu.kernels.vec_dot.mul_mat_job import WAIT_POLLS
from pyggml.core.errors import ArgumentError

# how the threads share a step: thread 0 calls job(d, 0); every thread calls job(d, 0), taking work items from the
# step's counter; every thread calls job(d, ith, nth) for its own share
ALONE, ITEMS, SPLIT = 0, 1, 2
# a step's row in the table: how, the job's address, its descriptor's address, its item counter's address (or 0)
STEP_FIELDS = 4
# the run's state: threads joined, threads at the barrier, barriers passed (each on its own cache line)
JOINED, ARRIVED, PASSED = 0, 8, 16
STATE_LEN = 24
# the run's descriptor as a worker slot: the table's address and rows, the state's address, LEAD's slots (address,
# workers) and polls of a waiting caller; the runner's address
TABLE, N_STEPS, STATE, SLOTS, N_SLOTS, SPINS, STAMPS, RUNNER = 1, 2, 3, LEAD_SLOTS_AT, LEAD_SLOTS, LEAD_SPINS, 7, 31
# how the threads go through a run: the caller steps through it, posting each ITEMS step to the workers as a lone
# product is posted (no barrier: a worker late or asleep is not waited for); or every thread steps through every
# step, a barrier after each (ggml_graph_compute_thread)
LEAD, BARRIER = "lead", "barrier"


@dataclass(frozen=True)
class Step:
    """One step of a node's job form: `job` (address) on `desc`'s operands, shared as `how` (ALONE, ITEMS, SPLIT);
    `counter`: ITEMS' int64[2] (items taken, done), zeroed after each run; `keep`: the arrays `desc` points into;
    `before`: Python run before the run's native call, on inputs no node of the run writes (`reads`); `after`: Python
    run after it (a check that raises)."""

    how: int
    job: int
    desc: np.ndarray
    counter: np.ndarray | None = None
    keep: tuple[object, ...] = ()
    before: Callable[[], None] | None = None
    reads: tuple[np.ndarray, ...] = ()
    after: Callable[[], None] | None = None


# a strided operand in a descriptor: its address, then 4 sizes and 4 byte strides, outermost first
VIEW_FIELDS = 9


def view_fields(a: np.ndarray) -> list[int] | None:
    """`a`'s VIEW_FIELDS (fewer dims padded in front), or None unless it has at most 4 dims, no negative stride
    and whole elements between its elements."""
    item = a.dtype.itemsize
    if a.ndim > 4 or any(st < 0 or st % item for st in a.strides):
        return None
    pad = 4 - a.ndim
    return [address(a), *([1] * pad), *a.shape, *([0] * pad), *a.strides]


def with_split_step(fn: Compute, job: int, head: Sequence[int], views: Sequence[np.ndarray]) -> Compute:
    """`fn` with a job form of one SPLIT step, `job` on `descriptor(head, views)`; `fn` as it is if views cannot be."""
    desc = descriptor(head, views)
    return fn if desc is None else with_steps(fn, (Step(SPLIT, job, desc, keep=tuple(views)),))


def descriptor(head: Sequence[int], views: Sequence[np.ndarray]) -> np.ndarray | None:
    """A step's descriptor: the `head` fields, then each of `views` as VIEW_FIELDS (None if one cannot be)."""
    fields = list(head)
    for v in views:
        f = view_fields(v)
        if f is None:
            return None
        fields += f
    return np.array(fields, np.int64)


def _make_view(pointer, dtype):
    item = dtype.itemsize

    @njit(nogil=True, cache=True, inline="always")
    def view(d, at):
        shape = (d[at + 1], d[at + 2], d[at + 3], d[at + 4])
        strides = (d[at + 5], d[at + 6], d[at + 7], d[at + 8])
        extent = 1
        for k in range(4):
            extent += (shape[k] - 1) * (strides[k] // item)
        base = numba.carray(pointer(d[at]), (max(extent, 0),))
        return np.lib.stride_tricks.as_strided(base, shape=shape, strides=strides)

    return view


def _make_rows(pointer):
    @njit(nogil=True, cache=True, inline="always")
    def rows(d, at):
        return numba.carray(pointer(d[at]), (d[at + 3], d[at + 4]))

    return rows


# a descriptor's C-contiguous operand at field `at` as its last two dims (a C-contiguous 2-D array)
rows_f32 = _make_rows(pointer_f32)
rows_i8 = _make_rows(pointer_i8)
rows_i32 = _make_rows(pointer_i32)
rows_i64 = _make_rows(pointer_i64)

# a descriptor's operand at field `at` as a 4-D strided array of float32, int32, int64 or uint16
view_f32 = _make_view(pointer_f32, np.dtype(np.float32))
view_i32 = _make_view(pointer_i32, np.dtype(np.int32))
view_i64 = _make_view(pointer_i64, np.dtype(np.int64))
view_u16 = _make_view(pointer_u16, np.dtype(np.uint16))


def with_steps(fn: Compute, steps: Sequence[Step]) -> Compute:
    """`fn` marked with its job form: the graph runner runs `steps` in its place (the same arithmetic)."""
    fn.graph_steps = tuple(steps)  # type: ignore[attr-defined]
    return fn


def steps_of(fn: Compute) -> tuple[Step, ...] | None:
    """The job form `with_steps` gave `fn`, or None."""
    return getattr(fn, "graph_steps", None)


@intrinsic
def call_split(typingctx, fn, d, ith, nth):
    """int64 job(int64 *d, int64 ith, int64 nth) at address `fn` on the descriptor at address `d`."""
    sig = types.int64(types.int64, types.int64, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fnty = ir.FunctionType(i64, [i64.as_pointer(), i64, i64])
        target = builder.inttoptr(args[0], fnty.as_pointer())
        return builder.call(target, [builder.inttoptr(args[1], i64.as_pointer()), args[2], args[3]])

    return sig, codegen


SPLIT_SIG = types.int64(types.CPointer(types.int64), types.int64, types.int64)


def split_job(fn: object) -> int:
    """The address of SPLIT job `fn(p, ith, nth)` (an njit function), compiled for SPLIT_SIG."""
    return compiled_address(fn, SPLIT_SIG)


ALONE_SIG = types.int64(types.CPointer(types.int64), types.int64)


def alone_job(fn: object) -> int:
    """The address of ALONE (or ITEMS) job `fn(p, shared)` (an njit function), compiled for ALONE_SIG."""
    return compiled_address(fn, ALONE_SIG)


@njit(nogil=True, cache=True, inline="always")
def thread_rows(n, ith, nth):
    """Thread ith's rows of n, in nth contiguous shares (ggml's dr = (nr + nth - 1) / nth)."""
    per = (n + nth - 1) // nth
    r0 = min(n, per * ith)
    return r0, min(n, r0 + per)


@njit(nogil=True, cache=True, inline="always")
def two_f32(p):
    """The two f32 operands of a descriptor of only them, at p."""
    d = numba.carray(p, (2 * VIEW_FIELDS,))
    return view_f32(d, 0), view_f32(d, VIEW_FIELDS)


@njit(nogil=True, cache=True, inline="always")
def share_of(a, ith, nth):
    """Thread ith's range of a 4-D array's rows (thread_rows of all of them)."""
    return thread_rows(a.shape[0] * a.shape[1] * a.shape[2], ith, nth)


@njit(nogil=True, cache=True, inline="always")
def row_at(a, r):
    """Row r of a 4-D array (rows in i3, i2, i1 order)."""
    n2, n1 = a.shape[1], a.shape[2]
    return a[r // (n2 * n1), (r // n1) % n2, r % n1]


@njit(nogil=True, cache=True, inline="always")
def barrier(state, nth):
    """ggml_barrier: the last thread to arrive lets the others on."""
    if nth == 1:
        return
    passed = atomic_load(state, PASSED)
    if atomic_add(state, ARRIVED, 1) == nth - 1:
        atomic_store(state, ARRIVED, 0)
        atomic_add(state, PASSED, 1)
        return
    polls = 0
    while atomic_load(state, PASSED) == passed:
        spin_pause()
        polls += 1
        if polls % YIELD_POLLS == 0:
            yield_cpu()


@njit(nogil=True, cache=True)
def lead_table(p, shared):
    """LEAD's runner, on the caller: every step in order, an ITEMS step posted to the workers' slots, shared, and
    taken back (as POOL.run with matmul's job), the others on the caller alone."""
    d = numba.carray(p, (SLOT_LEN,))
    table = numba.carray(pointer_i64(d[TABLE]), (d[N_STEPS], STEP_FIELDS))
    n = d[N_SLOTS]
    slots = numba.carray(pointer_i64(d[SLOTS]), (max(n, 1), SLOT_LEN))
    stamps = numba.carray(pointer_i64(d[STAMPS]), (table.shape[0] + 1 if d[STAMPS] else 0,))
    if stamps.shape[0]:
        stamps[0] = cycle_counter()
    for i in range(table.shape[0]):
        how, job, at = table[i, 0], table[i, 1], table[i, 2]
        if how == SPLIT:
            call_split(job, at, 0, 1)
        elif how == ALONE:
            call_job(job, numba.carray(pointer_i64(at), (SLOT_LEN,)), 0)
        else:
            step = numba.carray(pointer_i64(at), (SLOT_LEN,))
            ctr = numba.carray(pointer_i64(table[i, 3]), (2,))
            ctr[0] = 0
            ctr[1] = 0
            step[WAIT_POLLS] = d[SPINS]
            post(slots, step, n)
            call_job(job, step, 1)
            revoke(slots, n)
        if stamps.shape[0]:
            stamps[i + 1] = cycle_counter()
    return 0


@njit(nogil=True, cache=True)
def run_table(p, shared):
    """BARRIER's runner (a worker's job, or the caller's with `shared` 1): every step of the table in order, a
    barrier after each (the steps' counters zeroed before: zero_counters)."""
    d = numba.carray(p, (SLOT_LEN,))
    table = numba.carray(pointer_i64(d[TABLE]), (d[N_STEPS], STEP_FIELDS))
    state = numba.carray(pointer_i64(d[STATE]), (STATE_LEN,))
    nth = d[N_THREADS]
    ith = 0 if shared else 1 + atomic_add(state, JOINED, 1)
    for i in range(table.shape[0]):
        how, job, at = table[i, 0], table[i, 1], table[i, 2]
        if how == SPLIT:
            call_split(job, at, ith, nth)
        elif how == ITEMS or ith == 0:
            call_job(job, numba.carray(pointer_i64(at), (SLOT_LEN,)), 0)
        barrier(state, nth)
    if ith == 0:
        state[JOINED] = 0
    return 0


@njit(nogil=True, cache=True)
def zero_counters(table):
    """The item counters of a table's steps zeroed, before its threads start."""
    for i in range(table.shape[0]):
        if table[i, 3] != 0:
            ctr = numba.carray(pointer_i64(table[i, 3]), (2,))
            ctr[0] = 0
            ctr[1] = 0


@functools.cache
def runner_address(mode: str) -> int:
    return compiled_address(lead_table if mode == LEAD else run_table, ALONE_SIG)


@njit(nogil=True, cache=True)
def run_shared(d, slots, n):
    """The caller's share of a run posted to n workers' slots (thread 0)."""
    call_job(d[RUNNER], d, 1)
    revoke(slots, n)  # every worker passed the last barrier: none is POSTED, each RUNNING one returns


@njit(nogil=True, cache=True)
def run_lead(d, shared):
    """LEAD's run on the caller (its runner by address: one compiled copy)."""
    call_job(d[RUNNER], d, 1)


class GraphRun:
    """Consecutive computes with job forms, as one table the kernel threads run in one native call."""

    def __init__(self, steps: Sequence[Step], pool: WorkerPool, n_threads: int, mode: str = LEAD,
                 node_steps: Sequence[int] = ()) -> None:
        if mode not in (LEAD, BARRIER):
            raise ArgumentError(f"graph runner: mode {mode!r} is not {LEAD!r} or {BARRIER!r}")
        self.steps = tuple(steps)
        # each before once (the same fill may serve many steps: every layer's ropes)
        self.befores = list(dict.fromkeys(s.before for s in self.steps if s.before is not None))
        self.afters = [s.after for s in self.steps if s.after is not None]
        self.pool = pool
        self.n_workers = max(0, n_threads - 1)
        self.table = np.zeros((len(self.steps), STEP_FIELDS), np.int64)
        for i, s in enumerate(self.steps):
            self.table[i] = (s.how, s.job, address(s.desc), 0 if s.counter is None else address(s.counter))
        self.state = np.zeros(STATE_LEN, np.int64)
        self.desc = np.zeros(SLOT_LEN, np.int64)
        self.desc[TABLE], self.desc[N_STEPS], self.desc[STATE] = address(self.table), len(self.steps), \
            address(self.state)
        self.desc[RUNNER] = runner_address(mode)
        self.mode = mode
        self.node_steps = tuple(node_steps)  # how many of the steps each node of the run has, in order
        self.stamps: np.ndarray | None = None
        if mode == LEAD and not any(s.how == ITEMS for s in self.steps):
            self.n_workers = 0  # no step the workers could share: the caller runs it alone, posting nothing

    def record(self) -> np.ndarray:
        """LEAD's cycle counter read before the run and after each step from now on (a profile's): the array."""
        if self.stamps is None:
            self.stamps = np.zeros(len(self.steps) + 1, np.int64)
            self.desc[STAMPS] = address(self.stamps)
        return self.stamps

    def __call__(self) -> None:
        for before in self.befores:
            before()
        if self.mode == BARRIER:
            zero_counters(self.table)
        if self.n_workers == 0:
            self.desc[N_THREADS], self.desc[N_SLOTS] = 1, 0
            run_shared(self.desc, self.pool.slots, 0)
        elif self.mode == LEAD:
            self.pool.lead(run_lead, self.desc, self.n_workers)
        else:
            self.pool.run_all(run_shared, self.desc, self.n_workers)
        for after in self.afters:
            after()
