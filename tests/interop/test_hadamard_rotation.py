"""The KV cache's Hadamard rotation (pyggml.models.attn_rot) against real ggml: llama.cpp hints the MUL_MAT
SRC0_IS_HADAMARD and ggml's CPU then applies a fast Walsh-Hadamard transform without reading the matrix;
pyggml's, hinted the same (the hint reaches C with the op_params), computes the same bits on its CPU."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pyggml.backends.cpu import cpu_init
from pyggml.core.context import Context
from pyggml.core.graph import Graph
from pyggml.core.ops.params import MulMatParams
from pyggml.core.tensor import OpHint
from pyggml.core.types import GGMLType
from pyggml.ggml_backend.tensor_io import tensor_get_numpy, tensor_set
from pyggml.models.attn_rot import hadamard, mul_mat_hadamard
from pyggml.testing import alloc_ctx_tensors, ggml_c


@pytest.mark.parametrize("n", [64, 128, 256])
def test_the_rotation_is_ggmls_fast_transform(n: int, ggml_c_lib: Any) -> None:
    backend = cpu_init(1)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    try:
        rot = ctx.new_tensor_2d(GGMLType.F32, n, n).set_name("rot")
        x = ctx.new_tensor_3d(GGMLType.F32, 256, 3, 5).set_name("x")  # rows of 256: 256 / n heads each
        out = mul_mat_hadamard(ctx, x, rot)
        node = out.src[0]
        assert MulMatParams.of(node).hint is OpHint.SRC0_IS_HADAMARD
        graph = Graph()
        graph.build_forward_expand(out)
        buf = alloc_ctx_tensors(ctx, backend)
        values = np.random.default_rng(n).standard_normal((5, 3, 256)).astype(np.float32)
        tensor_set(rot, hadamard(n))
        tensor_set(x, values)
        backend.graph_compute(graph)
        ours = tensor_get_numpy(node)
        # C gets a zero matrix: the hint, not the matrix, makes its result (ggml_compute_forward_fwht)
        tensor_set(rot, np.zeros((n, n), dtype=np.float32))
        theirs = ggml_c.compute_like(node)
        assert ours.shape == theirs.shape
        assert np.array_equal(ours, theirs)  # the CPU's transform, ggml's order of operations
        # and neither is the input: the transform was applied
        assert np.abs(ours.reshape(-1) - values.reshape(-1)).max() > 0.1
        buf.free()
    finally:
        ctx.free()
