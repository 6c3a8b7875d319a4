"""The threaded path of the MUL_MAT direct kernels: the caller and pool workers share the rows.

Results must equal the one-thread path bit for bit (each output is one row's
dot product, whoever computes it), for every slicing and thread count; a
worker that starts after its call has returned must change nothing.
"""

from __future__ import annotations

import threading
import time

import gguf
import numba
import numpy as np
import pytest
from kernel_helpers import F16, F32, compile_node, new_ctx, tensor
from numba import njit

from pyggml.backends.cpu.kernels import ComputeParams, atomics, matmul, threads
from pyggml.backends.cpu.kernels.vec_dot import block_sums, kinds, mul_mat_job, quant_loops, quantize_src1
from pyggml.core.errors import ArgumentError
from pyggml.core.types import GGMLType


def _weights(ctx, wtype: GGMLType, shape: tuple[int, ...], rng: np.random.Generator):
    values = rng.standard_normal(shape).astype(np.float32)
    t = ctx.new_tensor(wtype, list(shape[::-1]))
    if wtype == F16:
        t.numpy()[...] = values.astype(np.float16)
    else:
        raw = gguf.quants.quantize(values.reshape(-1, shape[-1]), gguf.GGMLQuantizationType(int(wtype)))
        t.numpy()[...] = raw.reshape(t.numpy().shape)
    return t


@pytest.mark.parametrize("wtype", [GGMLType.Q4_0, GGMLType.Q8_0, F16])
@pytest.mark.parametrize(("wshape", "xshape"), [((1, 1, 300, 64), (1, 1, 3, 64)),
                                                ((1, 2, 70, 64), (2, 4, 2, 64))])  # broadcast over dims 2, 3
@pytest.mark.parametrize("n_threads", [2, 3])
def test_threaded_equals_one_thread(wtype: GGMLType, wshape: tuple[int, ...], xshape: tuple[int, ...],
                                    n_threads: int, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = new_ctx(8)
    w = _weights(ctx, wtype, wshape, rng)
    x = tensor(ctx, F32, rng.standard_normal(xshape).astype(np.float32))
    got = []
    for min_work, nt in ((1 << 62, 1), (0, n_threads)):
        monkeypatch.setattr(matmul, "PARALLEL_MIN_WORK", min_work)
        node = ctx.mul_mat(w, x)
        fn = compile_node(node, ComputeParams(n_threads=nt))
        for _ in range(3):  # repeated calls reuse the prepared counter
            fn()
        got.append(node.numpy().copy())
    assert np.any(got[0] != 0)
    np.testing.assert_array_equal(got[0], got[1])


def test_small_products_stay_on_the_calling_thread(rng: np.random.Generator) -> None:
    """Below PARALLEL_MIN_WORK the prepared call is the one-thread kernel itself (no hand-off)."""
    ctx = new_ctx(4)
    node = ctx.mul_mat(_weights(ctx, F16, (1, 1, 64, 64), rng), tensor(ctx, F32, np.ones((1, 1, 1, 64), np.float32)))
    assert 64 * 64 < matmul.PARALLEL_MIN_WORK
    fn = compile_node(node, ComputeParams(n_threads=2))
    fn()
    assert fn.__closure__ is not None
    inner = [c.cell_contents for c in fn.__closure__ if callable(c.cell_contents)]
    assert any(getattr(f, "func", None) is matmul._run_alone for f in inner)


def _f16_job(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """An F16 40x64 mat-vec as a MUL_MAT job of 5 items of 8 rows: (w, x, out, its counter, its descriptor)."""
    K, M = 64, 40
    w = rng.standard_normal((M, K)).astype(np.float16)
    wb, w_off = w.view(np.uint8).reshape(-1), np.arange(M, dtype=np.int64) * 2 * K
    x = rng.standard_normal((1, K)).astype(np.float32)
    out = np.zeros((1, M), np.float32)
    empty = (np.zeros((0, 0), np.int8), np.zeros((0, 0), np.float32), np.zeros((0, 0), np.float32),
             np.zeros((0, 0), np.int32))
    ctr = np.zeros(2, np.int64)
    desc = mul_mat_job.mul_mat_desc(kinds.F16, wb, w_off, K, x, *empty, 1, np.zeros(1, np.int64), out, 8, ctr,
                                    quantize_src1.ROUND_REF)
    return w, x, out, ctr, desc


def test_late_worker_changes_nothing(rng: np.random.Generator) -> None:
    """A job whose counter is exhausted (its call already returned) takes no item and writes nothing."""
    w, x, out, ctr, desc = _f16_job(rng)
    mul_mat_job.mul_mat_job(desc, 1)  # the caller's share: it returns when every item is done
    assert list(ctr) == [5 + 1, 5]  # 5 items of 8 rows, one failed take
    want = out.copy()
    np.testing.assert_allclose(want[0], w.astype(np.float32) @ x[0], rtol=1e-5, atol=1e-5)
    out[...] = -1
    mul_mat_job.mul_mat_job(desc, 0)  # a worker's share
    assert np.all(out == -1) and ctr[1] == 5


def test_mul_mat_desc_takes_contiguous_operands_only() -> None:
    f32, i8, i32 = np.zeros((0, 0), np.float32), np.zeros((0, 0), np.int8), np.zeros((0, 0), np.int32)
    w, w_off, base, ctr = np.zeros(64, np.uint8), np.zeros(2, np.int64), np.zeros(1, np.int64), np.zeros(2, np.int64)
    out = np.zeros((4, 2), np.float32)
    desc = mul_mat_job.mul_mat_desc(kinds.F16, w, w_off, 16, f32, i8, f32, f32, i32, 1, base, out, 0, ctr, 0)
    assert desc.shape == (threads.SLOT_LEN,) and desc[1] == kinds.F16 and desc[0] == threads.IDLE
    with pytest.raises(ValueError, match="not a C-contiguous"):
        mul_mat_job.mul_mat_desc(kinds.F16, w, w_off, 16, f32, i8, f32, f32, i32, 1, base, out[:, :1], 0, ctr, 0)
    with pytest.raises(ValueError, match="float32"):
        mul_mat_job.mul_mat_desc(kinds.F16, w, w_off, 16, f32, i8, f32, f32, i32, 1, base, out.astype(np.float64),
                                 0, ctr, 0)


# --- the pool's protocol, with a job of its own: add d[2] to the int64 at address d[1] ---


@njit(nogil=True)
def _add_job(d):
    hits = numba.carray(atomics.pointer_i64(d[1]), (1,))
    atomics.atomic_add(hits, 0, d[2])


@njit(nogil=True)
def _add_spin(slot, spins):
    idle = 0
    while idle < spins:
        if threads.claim(slot):
            _add_job(slot)
            threads.finish(slot)
            idle = 0
        else:
            idle += 1


@njit(nogil=True)
def _wait_then_revoke(d, slots, n):
    """The caller's share: wait (bounded) until the workers' adds arrived, then revoke."""
    hits = numba.carray(atomics.pointer_i64(d[1]), (1,))
    for _ in range(2_000_000_000):
        if atomics.atomic_load(hits, 0) >= n * d[2]:
            break
        atomics.spin_pause()
    threads.revoke(slots, n)


@njit(nogil=True)
def _revoke_only(d, slots, n):
    threads.revoke(slots, n)


def _add_desc(hits: np.ndarray, amount: int) -> np.ndarray:
    desc = np.zeros(threads.SLOT_LEN, np.int64)
    desc[1], desc[2] = atomics.address(hits), amount
    return desc


def _wait_for(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.001)
    return False


def test_pool_runs_posted_jobs_on_its_workers() -> None:
    pool = threads.WorkerPool(_add_spin)
    for _ in range(20):
        hits = np.zeros(1, np.int64)
        pool.run(_wait_then_revoke, _add_desc(hits, 1), 2)
        assert hits[0] == 2  # each of the 2 workers ran the job once
    assert len(pool.workers) == 2 and all(t.is_alive() for t in pool.workers)
    assert np.all(pool.slots[:2, 0] == threads.IDLE)


def test_pool_wakes_a_sleeping_worker() -> None:
    pool = threads.WorkerPool(_add_spin)
    pool.ensure(1)
    pool.spins = 100  # polls before sleeping: the worker sleeps almost at once
    assert _wait_for(lambda: pool.sleeping[0])
    hits = np.zeros(1, np.int64)
    pool.run(_wait_then_revoke, _add_desc(hits, 5), 1)
    assert hits[0] == 5


def test_revoked_job_never_runs() -> None:
    """A job revoked before a worker claimed it is gone: a worker arriving later finds its slot IDLE."""
    pool = threads.WorkerPool(_add_spin)
    hits = np.zeros(1, np.int64)
    threads._post(pool.slots, _add_desc(hits, 1), 1)  # no worker exists yet
    assert pool.slots[0, 0] == threads.POSTED
    _revoke_only(_add_desc(hits, 1), pool.slots, 1)
    assert pool.slots[0, 0] == threads.IDLE
    pool.ensure(1)
    time.sleep(0.05)  # the worker polls its slot meanwhile
    assert hits[0] == 0


@njit(nogil=True)
def _claim(slot):
    return threads.claim(slot)


@njit(nogil=True)
def _wait_claimed_then_revoke(d, slots, n):
    """The caller's share: wait (bounded) until worker 0 claimed the job, then revoke (waits while RUNNING)."""
    for _ in range(2_000_000_000):
        if atomics.atomic_load(slots, 0) != threads.POSTED:
            break
        atomics.spin_pause()
    threads.revoke(slots, n)


def test_worker_survives_a_failing_job() -> None:
    """A job that raises: the worker logs it, frees the slot (the caller waiting on it returns) and goes on."""
    claimed: list[int] = []

    def failing_spin(slot: np.ndarray, spins: int) -> None:
        if _claim(slot):
            claimed.append(1)
            raise RuntimeError("boom")

    pool = threads.WorkerPool(failing_spin)
    pool.ensure(1)
    pool.spins = 1
    hits = np.zeros(1, np.int64)
    for k in range(1, 4):
        pool.run(_wait_claimed_then_revoke, _add_desc(hits, 1), 1)
        assert len(claimed) == k and pool.slots[0, 0] == threads.IDLE
    assert pool.workers[0].is_alive()


def test_second_caller_computes_alone(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two threads computing threaded products at once: one has the workers, the other computes alone; both
    results equal the one-thread results."""
    monkeypatch.setattr(matmul, "PARALLEL_MIN_WORK", 0)
    ctx = new_ctx(16)
    nodes, wants = [], []
    for _ in range(2):
        w = _weights(ctx, GGMLType.Q8_0, (1, 1, 256, 128), rng)
        x = tensor(ctx, F32, rng.standard_normal((1, 1, 3, 128)).astype(np.float32))
        node = ctx.mul_mat(w, x)
        compile_node(node, ComputeParams(n_threads=1))()
        wants.append(node.numpy().copy())
        nodes.append((node, compile_node(node, ComputeParams(n_threads=2))))
    errors: list[str] = []

    def hammer(i: int) -> None:
        node, fn = nodes[i]
        for _ in range(300):
            fn()
            if not np.array_equal(node.numpy(), wants[i]):
                errors.append(f"product {i} differs")
                return

    ts = [threading.Thread(target=hammer, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in ts)


@pytest.mark.parametrize(("block_bytes", "values", "minus_8"), [(34, "q8_0_values", False),
                                                                 (18, "q4_0_nibbles", True)])
@pytest.mark.slow
def test_row_loops_portable_and_native_agree(block_bytes: int, values: str, minus_8: bool,
                                             rng: np.random.Generator) -> None:
    """The whole-row Q8_0/Q4_0 loops with the portable block sums and with the target's (AVX2's byte
    multiply-add where there is AVX2) against a float64 reference, weights with every byte value."""
    from numba import njit

    nb, M = 13, 9  # 13 blocks: the 4-block unrolled loop and its tail
    w = rng.integers(0, 256, (M, nb, block_bytes), dtype=np.uint8)
    w[:, :, :2] = np.frombuffer(np.float16(0.03125).tobytes(), np.uint8)  # exact scales
    w[0, :, 2:] = 0x80  # Q8_0: -128 everywhere in row 0
    yq = rng.integers(-127, 128, (1, 32 * nb), dtype=np.int8)
    yq[0, :32] = 127
    yd = np.full((1, nb), 0.5, np.float32)
    yb = yq.reshape(1, -1, 16).sum(axis=2, dtype=np.int32)
    if block_bytes == 34:
        q = w[:, :, 2:].view(np.int8).astype(np.float64)
    else:
        raw = w[:, :, 2:].astype(np.int64)
        q = np.concatenate([(raw & 15) - 8, (raw >> 4) - 8], axis=2).astype(np.float64)
    want = (q.reshape(M, -1) @ yq[0].astype(np.float64)) * 0.03125 * 0.5

    def row_loop(sums):
        dot = quant_loops.make_dot_q_row(block_bytes, getattr(block_sums, values), sums, minus_8)

        @njit
        def rows(w, yq, yd, yb, out):
            for m in range(out.shape[0]):
                out[m] = dot(w, m * w.shape[1] * w.shape[2], w.shape[1], yq, 0, yd, 0, yb, 0)

        return rows

    pairs = ((block_sums.block_sums_unsigned_portable, block_sums.target_block_sums_unsigned) if minus_8
             else (block_sums.block_sums_portable, block_sums.target_block_sums))
    for sums in pairs:
        out = np.zeros(M, np.float32)
        row_loop(sums)(w, yq, yd, yb, out)
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-3)


def test_spin_time_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(threads.ENV_SPIN_US, raising=False)
    assert threads.spin_seconds() == threads.SPIN_SECONDS
    monkeypatch.setenv(threads.ENV_SPIN_US, "250")
    assert threads.spin_seconds() == pytest.approx(250e-6)
    monkeypatch.setenv(threads.ENV_SPIN_US, "0")  # sleep at once: a worker still looks at its slot once
    pool = threads.WorkerPool(_add_spin)
    pool.ensure(1)
    assert pool.spins == 1
    hits = np.zeros(1, np.int64)
    pool.run(_wait_then_revoke, _add_desc(hits, 3), 1)  # woken from its sleep for each job
    assert hits[0] == 3
    for bad in ("abc", "-1", "2000000"):
        monkeypatch.setenv(threads.ENV_SPIN_US, bad)
        with pytest.raises(ArgumentError, match=threads.ENV_SPIN_US):
            threads.spin_seconds()


# --- the waiting caller: it spins its budget of polls, then sleeps ---


@pytest.mark.parametrize("wait_polls", [0, 1 << 40])  # sleep at once; spin all along
def test_caller_waits_for_a_late_worker_sleeping_or_spinning(wait_polls: int, rng: np.random.Generator) -> None:
    """The caller's share returns only when a worker's item is done, whether it waits by sleeping or by
    spinning: a thread holds one item (taken from the counter first) and finishes it later."""
    w, x, out, ctr, desc = _f16_job(rng)
    desc[mul_mat_job.WAIT_POLLS] = wait_polls
    ctr[0] = 1  # item 0 is held by a late worker: rows 0..7 are its
    returned = threading.Event()
    caller = threading.Thread(target=lambda: (mul_mat_job.mul_mat_job(desc, 1), returned.set()))
    caller.start()
    assert _wait_for(lambda: ctr[1] == 4)  # the caller did the 4 other items
    time.sleep(0.05)
    assert not returned.is_set()  # and waits for the held one
    out[0, :8] = 7.0  # the late worker's item
    _count_done(ctr)
    caller.join(10)
    assert returned.is_set() and np.all(out[0, :8] == 7.0)
    np.testing.assert_allclose(out[0, 8:], (w.astype(np.float32) @ x[0])[8:], rtol=1e-5, atol=1e-5)


@njit(nogil=True)
def _count_done(ctr):
    """A worker's item counted done (release: its writes before)."""
    atomics.atomic_add(ctr, 1, 1)


@pytest.mark.parametrize("spin_us", ["0", "1000"])
def test_threaded_products_with_sleeping_or_spinning_workers(spin_us: str, rng: np.random.Generator,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """PYGGML_CPU_SPIN_US 0 (workers and the waiting caller sleep at once) and 1000 (they spin 1 ms first):
    the same bits as one thread, call after call (a fresh pool reads the setting)."""
    monkeypatch.setenv(threads.ENV_SPIN_US, spin_us)
    monkeypatch.setattr(matmul, "POOL", threads.new_pool(mul_mat_job.mul_mat_spin))
    monkeypatch.setattr(matmul, "PARALLEL_MIN_WORK", 0)
    ctx = new_ctx(8)
    w = _weights(ctx, GGMLType.Q8_0, (1, 1, 256, 128), rng)
    x = tensor(ctx, F32, rng.standard_normal((1, 1, 3, 128)).astype(np.float32))
    node = ctx.mul_mat(w, x)
    compile_node(node, ComputeParams(n_threads=1))()
    want = node.numpy().copy()
    fn = compile_node(node, ComputeParams(n_threads=2))
    for _ in range(20):
        node.numpy()[...] = 0
        fn()
        np.testing.assert_array_equal(node.numpy(), want)
    assert (matmul.POOL.spins == 1) == (spin_us == "0")  # 0: one look at the slot, then sleep


# --- ThreadTeam: the BLAS paths' Python threads ---


def test_team_runs_every_item_once_on_its_slots() -> None:
    team = threads.ThreadTeam()
    for n_threads in (1, 2, 3):
        seen: list[tuple[int, int]] = []
        lock = threading.Lock()

        def item(slot: int, i: int, seen: list[tuple[int, int]] = seen, lock: threading.Lock = lock) -> None:
            with lock:
                seen.append((slot, i))

        team.run(item, 50, n_threads)
        assert sorted(i for _, i in seen) == list(range(50))
        assert {slot for slot, _ in seen} <= set(range(n_threads))


def test_team_raises_an_items_error_after_every_item() -> None:
    team = threads.ThreadTeam()
    done: list[int] = []

    def item(slot: int, i: int) -> None:
        if i == 3:
            raise ValueError("item 3")
        done.append(i)

    with pytest.raises(ValueError, match="item 3"):
        team.run(item, 20, 2)
    assert sorted(done) == [i for i in range(20) if i != 3]
    team.run(lambda slot, i: done.append(100 + i), 2, 2)  # still usable
    assert sorted(done)[-2:] == [100, 101]


def test_team_second_caller_computes_alone() -> None:
    team = threads.ThreadTeam()
    inside = threading.Event()
    release = threading.Event()
    slots: list[int] = []

    def slow(slot: int, i: int) -> None:
        inside.set()
        release.wait(10)

    t = threading.Thread(target=team.run, args=(slow, 2, 2))
    t.start()
    assert inside.wait(10)
    team.run(lambda slot, i: slots.append(slot), 3, 2)  # the helpers are taken: slot 0, this thread
    assert slots == [0, 0, 0]
    release.set()
    t.join(10)
    assert not t.is_alive()


def test_blas_path_threaded_equals_one_thread(rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt-sized Q4_1 product (the BLAS path) on 2 threads of TEAM: each output the same bits as on one."""
    monkeypatch.setattr(matmul, "BLAS_PARALLEL_MIN_WORK", 0)
    ctx = new_ctx(8)
    w = _weights(ctx, GGMLType.Q4_1, (1, 2, 72, 64), rng)
    x = tensor(ctx, F32, rng.standard_normal((2, 2, 20, 64)).astype(np.float32))  # broadcast over dim 3
    node = ctx.mul_mat(w, x)
    compile_node(node, ComputeParams(n_threads=1))()
    want = node.numpy().copy()
    assert np.any(want != 0)
    fn = compile_node(node, ComputeParams(n_threads=2))
    for _ in range(3):
        node.numpy()[...] = 0
        fn()
        np.testing.assert_array_equal(node.numpy(), want)
