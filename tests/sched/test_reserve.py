"""Scheduler.reserve and auto_reserve: a graph that needs more memory than the measure graph measured.

A graph smaller than the measure graph can still need more: the LLaMA graph of
8 tokens at n_past 0 leaves other holes than the one at n_past 1 (its KQ is
narrower) and its best-fit choices run out of room at `ffn_up-0`.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from sched_graphs import build_block, compute_on_one_backend, input_values, make_weights, run_block, set_inputs

from pyggml.alloc.graph_allocator import GraphAllocator
from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.backends.cpu import cpu_init
from pyggml.capi.sched import ggml_backend_sched_reserve
from pyggml.core.context import Context, tensor_overhead
from pyggml.core.errors import GraphError, OutOfMemoryError
from pyggml.core.graph import graph_overhead
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import tensor_get_numpy, tensor_set_numpy
from pyggml.models.kv_cache import KVCache
from pyggml.models.llama import LlamaHParams, build_llama, graph_size, tensor_names
from pyggml.seed import Scheduler
from pyggml.testing import alloc_ctx_tensors

HP = LlamaHParams(n_vocab=32, n_ctx_train=64, n_embd=32, n_layer=1, n_ff=64, n_head=4, n_head_kv=1, n_rot=8,
                  f_norm_rms_eps=1e-5, rope_freq_base=10000.0, rope_freq_scale=1.0)
N_TOKENS, N_PAST_MEASURED = 8, 1


class TinyLlama:
    """Weights of HP with random values in one buffer of `backend`."""

    def __init__(self, backend: object, seed: int = 5) -> None:
        e, f, kv = HP.n_embd, HP.n_ff, HP.n_embd_gqa
        shapes = {"token_embd": [e, HP.n_vocab], "output_norm": [e], "output": [e, HP.n_vocab], "attn_norm": [e],
                  "attn_q": [e, e], "attn_k": [e, kv], "attn_v": [e, kv], "attn_output": [e, e], "ffn_norm": [e],
                  "ffn_gate": [e, f], "ffn_up": [e, f], "ffn_down": [f, e]}
        self.ctx = Context(mem_size=32 * tensor_overhead(), no_alloc=True)
        self.w = {n: self.ctx.new_tensor(GGMLType.F32, shapes[n.split(".")[-2]]).set_name(n)
                  for n in tensor_names(HP)}
        self.buffer = alloc_ctx_tensors(self.ctx, backend)
        rng = np.random.default_rng(seed)
        for name, t in self.w.items():
            ne = [n for n in reversed(t.ne[: t.n_dims()])]
            scale = 1.0 if "norm" in name else 0.3
            tensor_set_numpy(t, (1.0 + 0.1 * rng.standard_normal(ne) if "norm" in name
                                 else scale * rng.standard_normal(ne)).astype(np.float32))

    def graph(self, kv: KVCache, n_tokens: int, n_past: int):
        size = graph_size(HP)
        ctx = Context(mem_size=size * tensor_overhead() + graph_overhead(size), no_alloc=True)
        gf, inp = build_llama(ctx, HP, self.w, kv, n_tokens, n_past, set_rows=False, glu=False)
        return ctx, gf, inp


def input_arrays(n_tokens: int, n_past: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    tokens = (np.arange(n_tokens, dtype=np.int32) * 7 + 3) % HP.n_vocab
    pos = np.arange(n_past, n_past + n_tokens, dtype=np.int32)
    cells = np.arange(n_past + n_tokens)
    mask = np.where(cells[None, :] <= pos[:, None], 0.0, -np.inf).astype(np.float32)
    return tokens, pos, mask


def llama_reference(n_tokens: int) -> np.ndarray:
    """The logits of the first `n_tokens` tokens on one CPU backend, no scheduler."""
    cpu = cpu_init(1)
    model = TinyLlama(cpu)
    kv = KVCache(1, n_tokens, HP.n_embd_gqa, [cpu], GGMLType.F16)
    _, gf, inp = model.graph(kv, n_tokens, 0)
    buffer = cpu.alloc_buffer(1 << 20)
    talloc = TensorAllocator.new_from_buffer(buffer)
    for t, v in zip((inp.tokens, inp.pos, inp.mask), input_arrays(n_tokens, 0), strict=True):
        talloc.alloc(t)
        tensor_set_numpy(t, v)
    GraphAllocator().alloc_graph(talloc, gf)
    cpu.graph_compute(gf)
    return tensor_get_numpy(inp.logits)


def llama_setup(auto_reserve: bool):
    """A scheduler over one CPU backend measured with N_TOKENS tokens at n_past N_PAST_MEASURED."""
    cpu = cpu_init(1)
    model = TinyLlama(cpu)
    kv = KVCache(1, N_TOKENS + N_PAST_MEASURED, HP.n_embd_gqa, [cpu], GGMLType.F16)
    sched = Scheduler([cpu], auto_reserve=auto_reserve)
    _, gf, inp = model.graph(kv, N_TOKENS, N_PAST_MEASURED)
    talloc = sched.get_tallocr(cpu)
    for t in (inp.tokens, inp.pos, inp.mask):
        talloc.alloc(t)
    sched.init_measure(gf)
    return cpu, model, kv, sched


def llama_batch(sched: Scheduler, cpu: object, model: TinyLlama, kv: KVCache):
    """A new graph of N_TOKENS tokens at n_past 0, its inputs placed and set."""
    ctx, gf, inp = model.graph(kv, N_TOKENS, 0)
    talloc = sched.get_tallocr(cpu)
    for t, v in zip((inp.tokens, inp.pos, inp.mask), input_arrays(N_TOKENS, 0), strict=True):
        talloc.alloc(t)
        tensor_set_numpy(t, v)
    return ctx, gf, inp


def test_smaller_graph_than_measured_raises_by_default() -> None:
    cpu, model, kv, sched = llama_setup(auto_reserve=False)
    buffer = sched.get_buffer(cpu)
    _, gf, _ = llama_batch(sched, cpu, model, kv)
    with pytest.raises(OutOfMemoryError, match="'ffn_up-0'.*more memory than init_measure measured"):
        sched.graph_compute(gf)
    assert sched.get_buffer(cpu) is buffer
    assert all(n.buffer is not buffer for n in gf.nodes)  # the failed allocation was rolled back

    # reserve by hand: a new graph, its inputs placed, reserved, then computed
    _, gf, inp = llama_batch(sched, cpu, model, kv)
    sched.reserve(gf)
    assert sched.get_buffer(cpu) is not buffer and buffer.freed
    assert sched.get_buffer(cpu).get_size() > buffer.get_size()
    sched.graph_compute(gf)
    np.testing.assert_allclose(tensor_get_numpy(inp.logits), llama_reference(N_TOKENS), rtol=1e-4, atol=1e-5)


def test_auto_reserve_computes_the_smaller_graph(caplog: pytest.LogCaptureFixture) -> None:
    cpu, model, kv, sched = llama_setup(auto_reserve=True)
    old_size = sched.get_buffer(cpu).get_size()
    _, gf, inp = llama_batch(sched, cpu, model, kv)
    with caplog.at_level(logging.INFO, logger="pyggml.sched"):
        sched.graph_compute(gf)
    new_size = sched.get_buffer(cpu).get_size()
    assert new_size > old_size
    assert f"compute buffer of CPU#0 grown from {old_size} to {new_size} bytes" in caplog.text
    # the inputs moved into the new buffer with their values (the logits need them)
    assert inp.tokens.buffer is sched.get_buffer(cpu)
    np.testing.assert_allclose(tensor_get_numpy(inp.logits), llama_reference(N_TOKENS), rtol=1e-4, atol=1e-5)

    # the next batch fits without growing
    caplog.clear()
    _, gf, inp = llama_batch(sched, cpu, model, kv)
    with caplog.at_level(logging.INFO, logger="pyggml.sched"):
        sched.graph_compute(gf)
    assert sched.get_buffer(cpu).get_size() == new_size and "grown" not in caplog.text
    np.testing.assert_allclose(tensor_get_numpy(inp.logits), llama_reference(N_TOKENS), rtol=1e-4, atol=1e-5)


def test_reserve_bigger_graph_grows_then_computes(cpu_a, cpu_b) -> None:
    weights = make_weights(lambda name: cpu_a if name.startswith("w") else cpu_b)
    sched = Scheduler([cpu_a, cpu_b])
    run_block(sched, weights, 2, cpu_b, None)
    before = [sched.get_buffer(b) for b in (cpu_a, cpu_b)]
    sizes = [b.get_size() for b in before]

    block = build_block(weights.tensors, 4)
    talloc = sched.get_tallocr(cpu_b)
    for t in block.inputs:
        talloc.alloc(t)
    srcs = [list(n.src) for n in block.graph.nodes]
    sched.reserve(block.graph)
    after = [sched.get_buffer(b) for b in (cpu_a, cpu_b)]
    assert all(a is not b and b.freed for a, b in zip(after, before, strict=True))
    assert all(a.get_size() > s for a, s in zip(after, sizes, strict=True))
    # the graph is as it was given: its own sources, no memory for its nodes, the inputs in the new buffer
    assert [list(n.src) for n in block.graph.nodes] == srcs
    assert all(n.data is None for n in block.graph.nodes if n.view_src is None)
    assert all(t.buffer is after[1] for t in block.inputs)
    assert sched.n_splits == 0 and sched.user_assignments == {}

    values = input_values(4)
    set_inputs(block, values)
    sched.graph_compute(block.graph)
    assert sched.n_splits > 1  # the split really used both backends
    np.testing.assert_allclose(tensor_get_numpy(block.out), compute_on_one_backend(cpu_init(1), 4, values),
                               rtol=1e-5, atol=1e-6)
    weights.free()


def test_reserve_keeps_buffers_with_room(cpu_a, cpu_b, caplog: pytest.LogCaptureFixture) -> None:
    weights = make_weights(lambda name: cpu_a if name.startswith("w") else cpu_b)
    sched = Scheduler([cpu_a, cpu_b])
    run_block(sched, weights, 6, cpu_b, None)
    before = [sched.get_buffer(b) for b in (cpu_a, cpu_b)]
    sizes = [b.get_size() for b in before]
    block = build_block(weights.tensors, 2)
    talloc = sched.get_tallocr(cpu_b)
    for t in block.inputs:
        talloc.alloc(t)
    addrs = [t.data for t in block.inputs]
    with caplog.at_level(logging.INFO, logger="pyggml.sched"):
        ggml_backend_sched_reserve(sched, block.graph)
    assert [sched.get_buffer(b) for b in (cpu_a, cpu_b)] == before and not any(b.freed for b in before)
    assert [b.get_size() for b in before] == sizes and "grown" not in caplog.text
    assert [t.data for t in block.inputs] == addrs
    values = input_values(2)
    set_inputs(block, values)
    sched.graph_compute(block.graph)
    np.testing.assert_allclose(tensor_get_numpy(block.out), compute_on_one_backend(cpu_init(1), 2, values),
                               rtol=1e-5, atol=1e-6)
    weights.free()


def test_auto_reserve_over_two_backends_and_a_larger_hash_table(cpu_a, cpu_b) -> None:
    weights = make_weights(lambda name: cpu_a if name.startswith("w") else cpu_b)
    sched = Scheduler([cpu_a, cpu_b], auto_reserve=True)
    run_block(sched, weights, 2, cpu_b, None)
    sizes = [sched.get_buffer(b).get_size() for b in (cpu_a, cpu_b)]
    values = input_values(4)
    block = run_block(sched, weights, 4, cpu_b, values)  # OutOfMemoryError without auto_reserve
    assert [sched.get_buffer(b).get_size() for b in (cpu_a, cpu_b)] > sizes
    np.testing.assert_allclose(tensor_get_numpy(block.out), compute_on_one_backend(cpu_init(1), 4, values),
                               rtol=1e-5, atol=1e-6)
    # a graph of a larger hash table than measured: the hash set grows too
    big = build_block(weights.tensors, 2, graph_size=8192)
    talloc = sched.get_tallocr(cpu_b)
    for t in big.inputs:
        talloc.alloc(t)
    values = input_values(2)
    set_inputs(big, values)
    sched.graph_compute(big.graph)
    np.testing.assert_allclose(tensor_get_numpy(big.out), compute_on_one_backend(cpu_init(1), 2, values),
                               rtol=1e-5, atol=1e-6)
    weights.free()


def test_reserve_needs_init_measure(cpu_a) -> None:
    weights = make_weights(lambda name: cpu_a)
    sched = Scheduler([cpu_a])
    with pytest.raises(GraphError, match="call init_measure"):
        sched.reserve(build_block(weights.tensors, 2).graph)
    weights.free()


def test_failed_allocation_leaves_the_graph_as_given(cpu_a, cpu_b) -> None:
    weights = make_weights(lambda name: cpu_a if name.startswith("w") else cpu_b)
    sched = Scheduler([cpu_a, cpu_b])
    run_block(sched, weights, 2, cpu_b, None)
    block = build_block(weights.tensors, 4)
    talloc = sched.get_tallocr(cpu_b)
    for t in block.inputs:
        talloc.alloc(t)
    srcs = [list(n.src) for n in block.graph.nodes]
    with pytest.raises(OutOfMemoryError):
        sched.graph_compute(block.graph)
    assert [list(n.src) for n in block.graph.nodes] == srcs  # not the scheduler's "CPU#..." copies
    assert sched.n_splits == 0
    weights.free()
