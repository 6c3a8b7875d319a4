"""Threads of the CPU kernels: workers that spin in native code between jobs, as ggml's threadpool, and a team of
Python threads for numpy/BLAS items (DESIGN.md, "Threads": why not OpenMP, the slots' hand-off)."""

from __future__ import annotations

import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from pyggml.backends.cpu.kernels.atomics import (
    address,
    atomic_cas,
    atomic_load,
    atomic_store,
    element_pointer,
    spin_pause,
)
from pyggml.core.errors import ArgumentError

log = logging.getLogger("pyggml.backends.cpu")

IDLE, POSTED, RUNNING = 0, 1, 2  # a slot's state (its element 0)
SLOT_LEN = 40  # int64 per slot: the state and up to 39 fields of a job (320 bytes: slots share no cache line)
LEAD_SLOTS_AT, LEAD_SLOTS, LEAD_SPINS = 4, 5, 6  # a `lead` job's fields: its slots, how many, idle polls
N_THREADS = SLOT_LEN - 1  # a slot's field with the threads a `run_all` job has (the caller and its workers)
MAX_WORKERS = 511  # GGML_MAX_N_THREADS - 1
ENV_SPIN_US = "PYGGML_CPU_SPIN_US"
SPIN_SECONDS = 0.001  # a worker's polling after its last job (llama.cpp's --poll): covers a decode step's gaps
YIELD_POLLS = 64  # a polling worker calls sched_yield every this many polls (a few microseconds)
WAIT_SLEEP_US = 20  # a caller's sleep between looks at its workers' last items, after the spin time


def spin_seconds() -> float:
    """The workers' spin time: PYGGML_CPU_SPIN_US (microseconds, 0 to 10^6) if set, else SPIN_SECONDS."""
    raw = os.environ.get(ENV_SPIN_US)
    if raw is None or raw.strip() == "":
        return SPIN_SECONDS
    try:
        us = int(raw)
    except ValueError:
        raise ArgumentError(f"{ENV_SPIN_US}={raw!r}: not an integer number of microseconds") from None
    if us < 0 or us > 1_000_000:
        raise ArgumentError(f"{ENV_SPIN_US}={us}: outside [0, 1000000] microseconds")
    return us * 1e-6


@njit(inline="always")
def claim(slot) -> bool:
    return atomic_load(slot, 0) == POSTED and atomic_cas(slot, 0, POSTED, RUNNING) == POSTED


@njit(inline="always")
def finish(slot) -> None:
    atomic_store(slot, 0, IDLE)


@intrinsic
def call_job(typingctx, fn, d, shared):
    """int64 job(int64 *d, int64 shared) at address `fn` on the slot or descriptor `d`: chosen at run time."""
    sig = types.int64(types.int64, d, types.int64)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fnty = ir.FunctionType(i64, [i64.as_pointer(), i64])
        target = builder.inttoptr(args[0], fnty.as_pointer())
        first = element_pointer(context, builder, signature.args[1], args[1], ir.Constant(i64, 0))
        return builder.call(target, [first, args[2]])

    return sig, codegen


@njit(nogil=True, cache=True)
def _idle_poll(slot, spins):
    n = 0
    for _ in range(spins):
        if atomic_load(slot, 0) == POSTED:
            n += 1
        spin_pause()
    return n


@njit(inline="always")
def post(slots, desc, n) -> None:
    """Copy the job `desc` to slots 0..n-1, then mark them POSTED."""
    for i in range(n):
        for k in range(1, desc.shape[0]):
            slots[i, k] = desc[k]
        atomic_store(slots, i * slots.shape[1], POSTED)


@njit(cache=True)
def _post(slots, desc, n):
    """`post`; not nogil: a sleeping worker checks under the GIL."""
    post(slots, desc, n)


@njit(inline="always")
def revoke(slots, n) -> None:
    """After the caller's share: slots 0..n-1 still POSTED go back to IDLE; a RUNNING one is waited for."""
    for i in range(n):
        at = i * slots.shape[1]
        if atomic_cas(slots, at, POSTED, IDLE) == RUNNING:
            while atomic_load(slots, at) == RUNNING:
                spin_pause()


class WorkerPool:
    """Workers running `spin(slot, spins)`; `run` posts a job, then `shared(desc, slots, n)` ends by `revoke`."""

    def __init__(self, spin: Callable[[np.ndarray, int], object]) -> None:
        self.spin = spin
        self.slots = np.zeros((MAX_WORKERS, SLOT_LEN), np.int64)
        self.workers: list[threading.Thread] = []
        self.conds: list[threading.Condition] = []
        self.sleeping: list[bool] = []
        self.woken: list[bool] = []
        self.lock = threading.Lock()
        self.spins = 0

    def _calibrate(self) -> int:
        seconds = spin_seconds()
        probe = np.zeros(SLOT_LEN, np.int64)
        _idle_poll(probe, 10)
        n = 20000
        t0 = time.perf_counter()
        _idle_poll(probe, n)
        dt = max(time.perf_counter() - t0, 1e-7)
        return max(1, int(n * seconds / dt))

    def _loop(self, i: int) -> None:
        slot, cond = self.slots[i], self.conds[i]
        while True:
            try:
                self.spin(slot, self.spins)
            except BaseException:  # a worker must survive, and free its slot for the caller waiting on it
                log.exception("CPU worker thread: job failed")
                slot[0] = IDLE
            with cond:
                self.sleeping[i] = True
                while slot[0] != POSTED and not self.woken[i]:
                    cond.wait()
                self.sleeping[i] = self.woken[i] = False

    def ensure(self, n_workers: int) -> None:
        n_workers = min(n_workers, MAX_WORKERS)
        if len(self.workers) >= n_workers:
            return
        if not self.spins:
            self.spins = self._calibrate()
        while len(self.workers) < n_workers:
            i = len(self.workers)
            self.conds.append(threading.Condition())
            self.sleeping.append(False)
            self.woken.append(False)
            t = threading.Thread(target=self._loop, args=(i,), name=f"pyggml-cpu-{i}", daemon=True)
            self.workers.append(t)
            t.start()

    def run(self, shared: Callable[[np.ndarray, np.ndarray, int], object], desc: np.ndarray, n_workers: int) -> None:
        if not self.lock.acquire(blocking=False):
            shared(desc, self.slots, 0)
            return
        try:
            self.ensure(n_workers)
            n = min(n_workers, len(self.workers))
            self._post_and_wake(desc, n)
            shared(desc, self.slots, n)
        finally:
            self.lock.release()

    def run_all(self, shared: Callable[[np.ndarray, np.ndarray, int], object], desc: np.ndarray,
                n_workers: int) -> None:
        """As `run`, for a job all threads take part in (barriers): desc[N_THREADS] says how many."""
        if not self.lock.acquire(blocking=False):
            desc[N_THREADS] = 1
            shared(desc, self.slots, 0)
            return
        try:
            self.ensure(n_workers)
            desc[N_THREADS] = min(n_workers, len(self.workers)) + 1
            self._post_and_wake(desc, int(desc[N_THREADS]) - 1)
            shared(desc, self.slots, int(desc[N_THREADS]) - 1)
        finally:
            self.lock.release()

    def lead(self, leader: Callable[[np.ndarray, int], object], desc: np.ndarray, n_workers: int) -> None:
        """`leader(desc, 1)` on the caller, posting to desc[LEAD_SLOTS] slots itself (DESIGN.md, "The graph runner")."""
        if not self.lock.acquire(blocking=False):
            desc[LEAD_SLOTS] = 0
            leader(desc, 1)
            return
        try:
            self.ensure(n_workers)
            n = min(n_workers, len(self.workers))
            for i in range(n):
                if self.sleeping[i]:
                    with self.conds[i]:
                        self.woken[i] = True
                        self.conds[i].notify()
            desc[LEAD_SLOTS_AT], desc[LEAD_SLOTS], desc[LEAD_SPINS] = address(self.slots), n, self.spins
            leader(desc, 1)
        finally:
            self.lock.release()

    def _post_and_wake(self, desc: np.ndarray, n: int) -> None:
        _post(self.slots, desc, n)
        # under the GIL: either a worker sees POSTED or this sees it asleep (DESIGN.md, "Threads")
        for i in range(n):
            if self.sleeping[i]:
                with self.conds[i]:
                    self.conds[i].notify()

    def _after_fork(self) -> None:
        self.__init__(self.spin)  # type: ignore[misc]


def new_pool(spin: Callable[[np.ndarray, int], object]) -> WorkerPool:
    """A WorkerPool that a forked child process replaces with an empty one."""
    pool = WorkerPool(spin)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=pool._after_fork)
    return pool


class _TeamCall:
    """One ThreadTeam.run: its items, taken from a shared counter, and how many are done."""

    def __init__(self, fn: Callable[[int, int], object], n_items: int) -> None:
        self.fn, self.n_items = fn, n_items
        self.items = itertools.count()  # next() is atomic under the GIL
        self.lock = threading.Lock()
        self.n_done = 0
        self.done = threading.Event()
        self.error: BaseException | None = None

    def work(self, slot: int) -> None:
        while (i := next(self.items)) < self.n_items:
            try:
                self.fn(slot, i)
            except BaseException as e:  # the caller raises it, after every item is accounted for
                self.error = self.error or e
            with self.lock:
                self.n_done += 1
                if self.n_done == self.n_items:
                    self.done.set()


class ThreadTeam:
    """Python threads sharing a call's items with the caller, for numpy/BLAS items run without the GIL."""

    def __init__(self) -> None:
        self.queues: list[queue.SimpleQueue[_TeamCall]] = []
        self.lock = threading.Lock()

    def _helper(self, q: queue.SimpleQueue[_TeamCall], slot: int) -> None:
        while True:
            q.get().work(slot)

    def ensure(self, n_helpers: int) -> None:
        while len(self.queues) < min(n_helpers, MAX_WORKERS):
            q: queue.SimpleQueue[_TeamCall] = queue.SimpleQueue()
            self.queues.append(q)
            threading.Thread(target=self._helper, args=(q, len(self.queues)), daemon=True,
                             name=f"pyggml-cpu-team-{len(self.queues)}").start()

    def run(self, fn: Callable[[int, int], object], n_items: int, n_threads: int) -> None:
        """fn(slot, item) for item in range(n_items), on up to n_threads threads (slot 0: the caller)."""
        if n_threads <= 1 or n_items <= 1 or not self.lock.acquire(blocking=False):
            for i in range(n_items):
                fn(0, i)
            return
        try:
            self.ensure(n_threads - 1)
            call = _TeamCall(fn, n_items)
            for q in self.queues[:n_threads - 1]:
                q.put(call)
            call.work(0)
            call.done.wait()
        finally:
            self.lock.release()
        if call.error is not None:
            raise call.error

    def _after_fork(self) -> None:
        self.__init__()  # type: ignore[misc]


def new_team() -> ThreadTeam:
    """A ThreadTeam that a forked child process replaces with an empty one."""
    team = ThreadTeam()
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=team._after_fork)
    return team

