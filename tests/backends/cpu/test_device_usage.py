"""Buffer usage honoured by the allocators: weights are never freed or overwritten, compute buffers are
marked as such by whoever makes them (the scheduler, the model's runners), weights by the loader."""

from __future__ import annotations

import numpy as np
import pytest

import pyggml.models as pm
from pyggml.alloc import GraphAllocator, TensorAllocator
from pyggml.backends.cpu import cpu_init
from pyggml.core.context import Context
from pyggml.core.types import GGMLType
from pyggml.ggml_backend import BufferUsage, tensor_get_numpy, tensor_set_numpy
from pyggml.models import builtin_model_path

F32 = GGMLType.F32


@pytest.mark.parametrize("usage", [BufferUsage.ANY, BufferUsage.WEIGHTS])
def test_the_graph_allocator_never_reuses_or_frees_weights(usage: BufferUsage) -> None:
    """w is allocated by the same tensor allocator before the graph (as the seed's inputs are): in a buffer
    of any use the graph allocator computes y = w + x in w's memory, which is the allocator's to reuse; in
    a WEIGHTS buffer w keeps its memory and its bytes."""
    cpu = cpu_init()
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    w = ctx.new_tensor_1d(F32, 16).set_name("w")
    x = ctx.new_tensor_1d(F32, 16).set_name("x")
    y = ctx.add(w, x).set_name("y")
    out = ctx.sqr(y).set_name("out")
    g = ctx.new_graph()
    g.build_forward_expand(out)
    talloc = TensorAllocator.new_from_backend(cpu, 1024)
    talloc.buffer.set_usage(usage)
    talloc.alloc(w)
    talloc.alloc(x)
    GraphAllocator().alloc_graph(talloc, g)
    if usage == BufferUsage.WEIGHTS:
        assert y.data != w.data and out.data != w.data and talloc.holds(w)
    else:
        assert y.data == w.data  # in place: the seed's way
    tensor_set_numpy(w, np.arange(16))
    tensor_set_numpy(x, np.ones(16))
    cpu.graph_compute(g)
    np.testing.assert_array_equal(tensor_get_numpy(out), (np.arange(16) + 1.0) ** 2)
    intact = np.array_equal(tensor_get_numpy(w), np.arange(16))
    assert intact == (usage == BufferUsage.WEIGHTS)
    talloc.free()


@pytest.mark.parametrize("backends", [["cpu"], ["cpu", "cpu"]], ids=["single", "sched"])
def test_the_model_marks_weights_and_compute_buffers(backends: list[str]) -> None:
    model = pm.load(builtin_model_path(), backends=backends, n_ctx=64, n_layers_on=[2] if len(backends) > 1 else None,
                    progress=False)
    try:
        assert all(b.get_usage() == BufferUsage.WEIGHTS for b in model.weights.buffers)
        model.eval_last(model.tokenize("The"))
        model.eval_last([7])  # a one-token graph
        compute = model.runner.sched.buffers
        assert len(compute) == len(model.runner.backends) and compute
        assert all(b is not None and b.get_usage() == BufferUsage.COMPUTE for b in compute)
        assert all(b.get_usage() == BufferUsage.ANY for b in model.kv.buffers)  # the cache is neither
    finally:
        model.free()
