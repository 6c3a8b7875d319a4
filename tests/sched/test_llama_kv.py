"""A two-layer LLaMA graph with a KV cache (pyggml.testing.graphs) over two backends, one layer each.

The K/V stores are CPY nodes into views of a layer's cache: pass 1 pins them
to the cache's backend ("1.vsrc"), and the attention's cache views read there.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from pyggml.alloc.graph_allocator import GraphAllocator
from pyggml.alloc.tensor_allocator import TensorAllocator
from pyggml.backends.cpu import cpu_init
from pyggml.core.context import Context
from pyggml.core.tensor import GGMLOp
from pyggml.ggml_backend import tensor_get_numpy, tensor_set_numpy
from pyggml.seed import Scheduler
from pyggml.testing.graphs import build_llama_graph, llama_input_values

DIMS = dict(n_layers=2, n_tokens=4, n_embd=32, n_head=4, n_head_kv=2, n_ff=64, n_vocab=50, n_ctx=8)


def layer(name: str) -> int | None:
    if name.startswith("blk."):
        return int(name.split(".")[1])
    if name.startswith(("k_cache-", "v_cache-")):
        return int(name.split("-")[1])
    return None


def build(backend_of):
    """A new graph with its weights and cache in buffers of `backend_of(name)`, values by name."""
    ctx = Context(mem_size=1 << 22, no_alloc=True)
    gf, inputs, weights = build_llama_graph(ctx, **DIMS)
    groups: dict[int, tuple[object, list]] = {}
    for w in weights:
        b = backend_of(w.name)
        groups.setdefault(id(b), (b, []))[1].append(w)
    buffers = []
    for b, ws in groups.values():
        buffer = b.alloc_buffer(sum(w.nbytes() + 64 for w in ws))
        talloc = TensorAllocator.new_from_buffer(buffer)
        for w in ws:
            talloc.alloc(w)
            rng = np.random.default_rng(zlib.crc32(w.name.encode()))
            shape = tuple(reversed(w.ne[: w.n_dims()]))
            if w.name.startswith(("k_cache", "v_cache")):
                values = np.zeros(shape, np.float32)
            elif w.name.endswith("norm.weight"):
                values = 1 + 0.1 * rng.standard_normal(shape)
            else:
                values = rng.standard_normal(shape) / math.sqrt(w.ne[0])
            tensor_set_numpy(w, values.astype(np.float32))
        buffers.append(buffer)
    return ctx, gf, inputs, buffers


def test_two_layers_with_kv_cache_on_two_backends(cpu_a, cpu_b) -> None:
    def backend_of(name: str):
        il = layer(name)
        if il is None:
            return cpu_a if name == "token_embd.weight" else cpu_b
        return cpu_a if il == 0 else cpu_b

    sched = Scheduler([cpu_a, cpu_b])
    _, gf, inputs, _ = build(backend_of)
    for name in ("tokens", "pos", "kq_mask"):
        sched.get_tallocr(cpu_a).alloc(inputs[name])
    sched.init_measure(gf)

    _, gf, inputs, buffers = build(backend_of)
    values = llama_input_values(inputs, n_vocab=DIMS["n_vocab"])
    for name, v in values.items():
        sched.get_tallocr(cpu_a).alloc(inputs[name])
        tensor_set_numpy(inputs[name], v)
    sched.graph_compute(gf)
    got = tensor_get_numpy(inputs["logits"])

    stores = [n for n in gf.nodes if n.op == GGMLOp.CPY]
    assert len(stores) == 4
    for node in stores:
        cache = node.view_src
        assert sched.tensor_cause(node) == "1.vsrc"
        assert sched.get_node_backend(node) is cache.buffer.backend is (cpu_a if cache.name.endswith("0") else cpu_b)
    kv_views = [n for n in gf.nodes if n.name in ("k-0", "v-0", "k-1", "v-1")]
    assert [sched.get_node_backend(n) for n in kv_views] == [cpu_a, cpu_a, cpu_b, cpu_b]
    # the cache holds this batch's K afterwards, in its backend's memory
    k_cache_1 = next(n.view_src for n in stores if n.view_src.name == "k_cache-1")
    assert np.abs(tensor_get_numpy(k_cache_1)[: 4 * 16]).max() > 0

    # the reference: everything on one CPU backend, no scheduler
    one = cpu_init(1)
    _, gf1, inputs1, _ = build(lambda name: one)
    talloc = TensorAllocator.new_from_backend(one, 1 << 20)
    for name, v in values.items():
        talloc.alloc(inputs1[name])
        tensor_set_numpy(inputs1[name], v)
    GraphAllocator().alloc_graph(talloc, gf1)
    one.graph_compute(gf1)
    np.testing.assert_allclose(got, tensor_get_numpy(inputs1["logits"]), rtol=1e-5, atol=1e-5)
    for b in buffers:
        b.free()
