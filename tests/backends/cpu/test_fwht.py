"""The CPU's MUL_MAT hinted SRC0_IS_HADAMARD (kernels.fwht, ggml_compute_forward_fwht): each src1 row's
orthonormal Walsh-Hadamard transform, src0 not read, F32 or F16 rows of any strides; the refusals of what
ggml asserts. Bit-exactness against ggml's own CPU is tests/interop/test_hadamard_rotation.py's."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import F16, F32, new_ctx, permuted, run, tensor

from pyggml.backends.cpu.kernels import matmul
from pyggml.core.errors import ShapeError, UnsupportedTypeError
from pyggml.core.ops.matmul import mul_mat_set_hint
from pyggml.core.tensor import OpHint
from pyggml.core.types import GGMLType
from pyggml.models.attn_rot import hadamard  # tested against numpy's Sylvester matrix in tests/models


def butterflies(x: np.ndarray) -> np.ndarray:
    """ggml's order in float32, written here: scale, then passes of pairs 1, 2, 4, ... apart."""
    n = x.shape[-1]
    y = x.astype(np.float32) * (np.float32(1) / np.sqrt(np.float32(n)))
    step = 1
    while step < n:
        y = y.reshape(-1, n // (2 * step), 2, step)
        u, v = y[:, :, 0].copy(), y[:, :, 1].copy()
        y[:, :, 0], y[:, :, 1] = u + v, u - v
        step *= 2
    return y.reshape(x.shape)


@pytest.mark.parametrize("n", [1, 2, 64, 256])
@pytest.mark.parametrize(("src1_type", "layout"), [(F32, "contiguous"), (F16, "contiguous"), (F32, "permuted")])
def test_a_hinted_product_is_the_transform_of_each_row(n: int, src1_type: GGMLType, layout: str) -> None:
    """With a zero src0 (ggml does not read it): the transform of each row, the bits of ggml's order (exact
    arithmetic apart from the float32 rounding of the butterflies) and H x within float rounding."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal((1, 3, 5, n)).astype(np.float32)
    if src1_type == F16:
        x = x.astype(np.float16).astype(np.float32)
    ctx = new_ctx()
    try:
        rot = tensor(ctx, F32, np.zeros((n, n), np.float32), "rot")
        src1 = (permuted(ctx, src1_type, x, "x") if layout == "permuted" else tensor(ctx, src1_type, x, "x"))
        node = ctx.mul_mat(rot, src1)
        mul_mat_set_hint(node, OpHint.SRC0_IS_HADAMARD)
        assert matmul.supports(node)
        got = run(node)
        assert np.array_equal(got, butterflies(x))
        want = x.astype(np.float64) @ hadamard(n).astype(np.float64).T
        assert np.allclose(got, want, rtol=0, atol=1e-5 * np.abs(x).max())
    finally:
        ctx.free()


def test_without_the_hint_src0_is_multiplied() -> None:
    ctx = new_ctx()
    try:
        x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
        node = ctx.mul_mat(tensor(ctx, F32, np.zeros((64, 64), np.float32), "rot"), tensor(ctx, F32, x, "x"))
        assert not run(node).any()
    finally:
        ctx.free()


@pytest.mark.parametrize(("shape0", "shape1", "src1_type", "error", "match"), [
    ((48, 48), (2, 48), F32, ShapeError, "needs rows of a power of two, src1 'x' has 48"),
    ((64, 32), (2, 64), F32, ShapeError, "needs src0 of 64 x 64, 'rot' is 64 x 32"),
    ((64, 64), (2, 64), GGMLType.BF16, UnsupportedTypeError, "src1 'x' has type BF16; with F32 weights it must be "
                                                             "F32 or F16"),
])
def test_what_ggml_asserts_is_refused(shape0: tuple[int, int], shape1: tuple[int, int], src1_type: GGMLType,
                                      error: type[Exception], match: str) -> None:
    ctx = new_ctx()
    try:
        rot = tensor(ctx, F32, np.zeros(shape0[::-1], np.float32), "rot")
        node = ctx.mul_mat(rot, tensor(ctx, src1_type, np.zeros(shape1, np.float32), "x"))
        mul_mat_set_hint(node, OpHint.SRC0_IS_HADAMARD)
        assert not matmul.supports(node)
        with pytest.raises(error, match=match):
            run(node)
    finally:
        ctx.free()
