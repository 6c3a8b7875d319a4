"""The scheduler by its C names, used the way llama.cpp used it at the time of the seed."""

from __future__ import annotations

import numpy as np
import pytest
from sched_graphs import build_block, compute_on_one_backend, input_values, make_weights, set_inputs

import pyggml.capi as C
from pyggml.backends.cpu import cpu_init
from pyggml.core.errors import ArgumentError
from pyggml.ggml_backend import tensor_get_numpy


def test_capi_scheduler_computes_a_block(cpu_a, cpu_b) -> None:
    assert (C.GGML_MAX_BACKENDS, C.GGML_MAX_SPLITS, C.GGML_MAX_SPLIT_INPUTS) == (4, 256, 16)
    weights = make_weights(lambda name: cpu_a)
    sched = C.ggml_backend_sched_new([cpu_a, cpu_b, cpu_init(1)], 2)
    assert sched.backends == [cpu_a, cpu_b]

    measure = build_block(weights.tensors, 4)
    for t in measure.inputs:
        C.ggml_backend_sched_get_tallocr(sched, cpu_b).alloc(t)
    C.ggml_backend_sched_set_node_backend(sched, measure.out, cpu_b)
    C.ggml_backend_sched_init_measure(sched, measure.graph)
    assert C.ggml_backend_sched_get_node_backend(sched, measure.out) is cpu_b
    assert C.ggml_backend_sched_get_buffer(sched, cpu_a).get_size() > 0

    block = build_block(weights.tensors, 4)
    for t in block.inputs:
        C.ggml_backend_sched_get_tallocr(sched, cpu_b).alloc(t)
    values = input_values(4)
    set_inputs(block, values)
    C.ggml_backend_sched_set_node_backend(sched, block.out, cpu_b)
    C.ggml_backend_sched_graph_compute(sched, block.graph)
    assert C.ggml_backend_sched_get_node_backend(sched, block.out) is cpu_b
    np.testing.assert_allclose(tensor_get_numpy(block.out), compute_on_one_backend(cpu_init(1), 4, values),
                               rtol=1e-5, atol=1e-6)
    C.ggml_backend_sched_set_node_backend(sched, block.out, cpu_a)
    C.ggml_backend_sched_reset(sched)
    assert sched.user_assignments == {}
    buffer = C.ggml_backend_sched_get_buffer(sched, cpu_a)
    C.ggml_backend_sched_free(sched)
    C.ggml_backend_sched_free(None)
    assert buffer.freed
    with pytest.raises(ArgumentError, match="n_backends 3 but 2 backends given"):
        C.ggml_backend_sched_new([cpu_a, cpu_b], 3)
    weights.free()
