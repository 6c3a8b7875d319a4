"""Threads of the CPU kernels: workers that spin in native code, as ggml's threadpool, between jobs.

Why not numba's `parallel=True`: its OpenMP runtime (libgomp) makes the
calling thread spin at the end of each parallel region until every worker has
checked in. On a loaded machine a worker is often not scheduled for a whole
time slice, and the region then takes milliseconds whatever its size
(benchmarks/README.md). OMP_WAIT_POLICY=passive
cures it only if set before a libgomp is loaded, and `import torch` loads its
own copy (same soname, which numba's OpenMP layer then uses).

Why not Python threads woken per job: a sleeping thread's wake (a futex wake of
an idle vCPU, then the GIL) takes longer than most decode products.

Here each worker owns a slot (a row of int64: state, then the job's fields, the
operands as addresses) and polls it from a nogil numba loop (the pool's `spin`
function, which knows the job) for `spin_seconds()` after its last job before
it sleeps on a condition, calling sched_yield every YIELD_POLLS polls so that
the process's other threads (serve's event loop) still get the core. The
caller posts a job to n slots, runs its own share, then revokes the slots: a
slot still POSTED goes back to IDLE, one RUNNING is waited for. So no worker
touches a job's memory after the caller returns. The kernel takes its work
items from an atomic counter (ggml's chunked scheduling): a worker that
starts late finds fewer items, or none.
"""

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

from pyggml.backends.cpu.kernels.atomics import atomic_cas, atomic_load, atomic_store, element_pointer, spin_pause
from pyggml.core.errors import ArgumentError

log = logging.getLogger("pyggml.backends.cpu")

IDLE, POSTED, RUNNING = 0, 1, 2  # a slot's state (its element 0)
SLOT_LEN = 40  # int64 per slot: the state and up to 39 fields of a job (320 bytes: slots share no cache line)
MAX_WORKERS = 511  # GGML_MAX_N_THREADS - 1
# how long a worker polls after its last job before it sleeps (as llama.cpp's --poll): PYGGML_CPU_SPIN_US in
# the environment, microseconds (0: sleep at once), else 1 ms, which covers the gaps between a decode step's
# products
ENV_SPIN_US = "PYGGML_CPU_SPIN_US"
SPIN_SECONDS = 0.001
YIELD_POLLS = 64  # a polling worker calls sched_yield every this many polls (a few microseconds)
# a caller waiting for its workers' last items, after the spin time, sleeps this long between looks
WAIT_SLEEP_US = 20


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
    """A worker takes its slot's posted job (POSTED -> RUNNING); False when there is none."""
    return atomic_load(slot, 0) == POSTED and atomic_cas(slot, 0, POSTED, RUNNING) == POSTED


@njit(inline="always")
def finish(slot) -> None:
    """A worker is done with its slot's job (RUNNING -> IDLE)."""
    atomic_store(slot, 0, IDLE)


@intrinsic
def call_job(typingctx, fn, d, shared):
    """Call the compiled job at address `fn`, C type int64 job(int64 *d, int64 shared), on the job `d` (a slot or
    a descriptor: an int64 array of SLOT_LEN); returns its result. The job's code is chosen at run time, so a
    worker's loop is compiled once for every kind of job (see `vec_dot.mul_mat_job.job_address`)."""
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
    """`spins` polls of a slot that never gets a job (calibrates SPIN_SECONDS)."""
    n = 0
    for _ in range(spins):
        if atomic_load(slot, 0) == POSTED:
            n += 1
        spin_pause()
    return n


@njit(cache=True)
def _post(slots, desc, n):
    """Copy the job `desc` (its fields from element 1) to slots 0..n-1 and mark them POSTED (release stores
    after the fields). Not nogil: a sleeping worker checks its state under the GIL (see WorkerPool.run)."""
    for i in range(n):
        for k in range(1, desc.shape[0]):
            slots[i, k] = desc[k]
        atomic_store(slots, i * slots.shape[1], POSTED)


@njit(inline="always")
def revoke(slots, n) -> None:
    """After the caller's share: slots 0..n-1 still POSTED go back to IDLE; a RUNNING one is waited for."""
    for i in range(n):
        at = i * slots.shape[1]
        if atomic_cas(slots, at, POSTED, IDLE) == RUNNING:
            while atomic_load(slots, at) == RUNNING:
                spin_pause()


class WorkerPool:
    """Worker threads for jobs run by `spin(slot, spins)`: a nogil numba loop that claims and runs the jobs
    posted to `slot` (see `claim`, `finish`) and returns after `spins` polls without one.

    `run(shared, desc, n)` posts `desc` to n workers and calls `shared(desc, slots, n)`: the caller's own
    share of the job, which ends by `revoke(slots, n)`. A second thread calling `run` while the workers
    are taken computes alone (`shared(desc, slots, 0)`)."""

    def __init__(self, spin: Callable[[np.ndarray, int], object]) -> None:
        self.spin = spin
        self.slots = np.zeros((MAX_WORKERS, SLOT_LEN), np.int64)
        self.workers: list[threading.Thread] = []
        self.conds: list[threading.Condition] = []
        self.sleeping: list[bool] = []
        self.lock = threading.Lock()  # held by the one caller using the workers
        self.spins = 0

    def _calibrate(self) -> int:
        """Polls in the spin time (at least 1: a worker always looks at its slot once before it sleeps)."""
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
                while slot[0] != POSTED:
                    cond.wait()
                self.sleeping[i] = False

    def ensure(self, n_workers: int) -> None:
        """Start threads until there are at least `n_workers` (at most MAX_WORKERS)."""
        n_workers = min(n_workers, MAX_WORKERS)
        if len(self.workers) >= n_workers:
            return
        if not self.spins:
            self.spins = self._calibrate()
        while len(self.workers) < n_workers:
            i = len(self.workers)
            self.conds.append(threading.Condition())
            self.sleeping.append(False)
            t = threading.Thread(target=self._loop, args=(i,), name=f"pyggml-cpu-{i}", daemon=True)
            self.workers.append(t)
            t.start()

    def run(self, shared: Callable[[np.ndarray, np.ndarray, int], object], desc: np.ndarray, n_workers: int) -> None:
        """Run the job `desc` on the calling thread and `n_workers` workers (see the class)."""
        if not self.lock.acquire(blocking=False):
            shared(desc, self.slots, 0)
            return
        try:
            self.ensure(n_workers)
            n = min(n_workers, len(self.workers))
            _post(self.slots, desc, n)
            # a worker sets `sleeping` and then reads its state, both under the GIL, as _post wrote the state
            # before this reads `sleeping`: either the worker sees POSTED or this sees it asleep
            for i in range(n):
                if self.sleeping[i]:
                    with self.conds[i]:
                        self.conds[i].notify()
            shared(desc, self.slots, n)
        finally:
            self.lock.release()

    def _after_fork(self) -> None:
        """In a forked child the workers do not exist: start afresh."""
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
        """Take items until none is left; a thread that comes after the call returned finds none."""
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
    """Python threads that share a call's work items with the caller, for kernels whose items run in numpy or
    BLAS (single-threaded each: the team is their parallelism) with the GIL released.

    `run(fn, n_items, n_threads)` calls fn(slot, item) for every item, on the caller (slot 0) and n_threads - 1
    helpers (slots 1..), each taking the next item from a shared counter: a thread that gets less of the
    machine (a core busy with another process) takes fewer items instead of holding the others up, and the
    caller waits only for the items already taken. Helpers sleep on their queue between calls, so an idle
    team costs nothing. A second thread calling `run` while the team is taken computes alone (slot 0)."""

    def __init__(self) -> None:
        self.queues: list[queue.SimpleQueue[_TeamCall]] = []
        self.lock = threading.Lock()  # held by the one caller using the helpers

    def _helper(self, q: queue.SimpleQueue[_TeamCall], slot: int) -> None:
        while True:
            q.get().work(slot)

    def ensure(self, n_helpers: int) -> None:
        """Start helpers until there are at least `n_helpers` (at most MAX_WORKERS)."""
        while len(self.queues) < min(n_helpers, MAX_WORKERS):
            q: queue.SimpleQueue[_TeamCall] = queue.SimpleQueue()
            self.queues.append(q)
            threading.Thread(target=self._helper, args=(q, len(self.queues)), daemon=True,
                             name=f"pyggml-cpu-team-{len(self.queues)}").start()

    def run(self, fn: Callable[[int, int], object], n_items: int, n_threads: int) -> None:
        """fn(slot, item) for item in range(n_items), on up to n_threads threads (slots 0..n_threads-1)."""
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
        """In a forked child the helpers do not exist: start afresh."""
        self.__init__()  # type: ignore[misc]


def new_team() -> ThreadTeam:
    """A ThreadTeam that a forked child process replaces with an empty one."""
    team = ThreadTeam()
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=team._after_fork)
    return team

