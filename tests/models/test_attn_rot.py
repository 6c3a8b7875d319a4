"""llama.cpp's Hadamard rotation of a quantized KV cache (pyggml.models.attn_rot): the matrix against numpy's
Sylvester construction, the graph's rotation against numpy and undone by itself, llama.cpp's conditions
(cache types, head sizes, K and V apart, LLAMA_ATTN_ROT_DISABLE read as atoi), and a model's cache holding
the rotated K and V of a quantized cache, the plain ones of an F16 cache."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.backends.cpu import cpu_init
from pyggml.core import quants
from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError
from pyggml.core.graph import Graph
from pyggml.core.ops.params import MulMatParams
from pyggml.core.tensor import GGMLOp, OpHint
from pyggml.core.types import GGMLType
from pyggml.ggml_backend.tensor_io import tensor_get, tensor_get_numpy, tensor_set
from pyggml.models import attn_rot, load
from pyggml.models.builtin import builtin_model_path
from pyggml.models.graph import build_graph
from pyggml.models.kv_cache import KVCache
from pyggml.testing import alloc_ctx_tensors

Q8, Q4, F16, F32 = GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.F16, GGMLType.F32
PROMPT = "Once upon a time there was a little girl who"


def sylvester(n: int) -> np.ndarray:
    """The Walsh-Hadamard matrix of order n by Kronecker products of [[1, 1], [1, -1]], orthonormal."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.kron(np.array([[1.0, 1.0], [1.0, -1.0]]), h)
    return h / np.sqrt(n)


@pytest.mark.parametrize("n", [1, 2, 64, 128, 256])
def test_the_matrix_is_the_orthonormal_walsh_hadamard_matrix(n: int) -> None:
    h = attn_rot.hadamard(n)
    assert h.dtype == np.float32 and h.shape == (n, n)
    assert np.array_equal(h, sylvester(n).astype(np.float32))  # +-1/sqrt(n) exactly: the sign pattern and value
    assert np.allclose(h @ h, np.eye(n), atol=1e-6)  # its own inverse


@pytest.mark.parametrize("n", [0, 3, 96])
def test_an_order_that_is_not_a_power_of_two_is_refused(n: int) -> None:
    with pytest.raises(ArgumentError, match=f"hadamard: order {n} is not a power of two"):
        attn_rot.hadamard(n)


def _rotate(x: np.ndarray, n: int, permuted: bool) -> tuple[np.ndarray, np.ndarray]:
    """x ([ne1, ne0] numpy) rotated by mul_mat_hadamard on the CPU backend, and rotated twice; `permuted` gives
    the graph x's transpose permuted back (a non-contiguous source, which the rotation copies first)."""
    backend = cpu_init(1)
    ctx = Context(mem_size=1 << 20, no_alloc=True)
    try:
        rot = ctx.new_tensor_2d(F32, n, n)
        if permuted:
            src = ctx.new_tensor_2d(F32, x.shape[0], x.shape[1])
            cur = ctx.permute(src, 1, 0, 2, 3)  # [ne0, ne1] again, strided
            assert not cur.is_contiguous()
        else:
            src = cur = ctx.new_tensor_2d(F32, x.shape[1], x.shape[0])
        once = attn_rot.mul_mat_hadamard(ctx, cur, rot)
        twice = attn_rot.mul_mat_hadamard(ctx, once, rot)
        graph = Graph()
        graph.build_forward_expand(twice)
        buf = alloc_ctx_tensors(ctx, backend)
        tensor_set(rot, attn_rot.hadamard(n))
        tensor_set(src, np.ascontiguousarray(x.T) if permuted else x)
        backend.graph_compute(graph)
        assert once.ne[:2] == [x.shape[1], x.shape[0]]
        out = tensor_get_numpy(once).reshape(x.shape), tensor_get_numpy(twice).reshape(x.shape)
        buf.free()
        return out
    finally:
        ctx.free()


@pytest.mark.parametrize("permuted", [False, True], ids=["contiguous", "permuted"])
def test_the_rotation_rotates_each_run_of_n_values_and_undoes_itself(permuted: bool) -> None:
    """Rows of 128 values (two heads of 64) rotated by the 64-matrix: numpy's H x of each half; twice: x."""
    x = np.random.default_rng(1).standard_normal((5, 128)).astype(np.float32)
    once, twice = _rotate(x, 64, permuted)
    want = (x.reshape(-1, 64).astype(np.float64) @ sylvester(64).T).reshape(x.shape)
    assert np.allclose(once, want, atol=1e-5)
    assert np.allclose(twice, x, atol=1e-5)


@pytest.mark.parametrize(("head_dim", "type_k", "type_v", "disabled", "sizes"), [
    (64, Q8, Q8, False, (64, 64)),
    (128, Q8, Q8, False, (128, 64)),  # K: the largest power of two dividing the head; V: always 64
    (192, Q4, Q4, False, (64, 64)),
    (256, GGMLType.IQ4_NL, GGMLType.Q5_1, False, (256, 64)),
    (256, Q8, F16, False, (256, 0)),  # K and V apart, by their types
    (64, GGMLType.BF16, Q4, False, (0, 64)),
    (64, F16, F16, False, (0, 0)),  # unquantized caches: never
    (64, F32, F32, False, (0, 0)),
    (96, Q8, Q8, False, (0, 0)),  # a head that is not a multiple of 64
    (32, Q8, Q8, False, (0, 0)),
    (0, Q8, Q8, False, (0, 0)),  # head size unknown
    (128, Q8, Q8, True, (0, 0)),  # LLAMA_ATTN_ROT_DISABLE
])
def test_the_rotations_follow_llamacpps_conditions(head_dim: int, type_k: GGMLType, type_v: GGMLType,
                                                   disabled: bool, sizes: tuple[int, int]) -> None:
    assert attn_rot.rot_sizes(head_dim, type_k, type_v, disabled) == sizes


@pytest.mark.parametrize(("value", "disabled"), [
    (None, False), ("", False), ("0", False), ("1", True), ("2", True), ("-1", True), (" 1", True),
    ("1x", True), ("x1", False), ("00", False), ("true", False), ("+0", False)])
def test_the_switch_is_read_as_c_atoi(value: str | None, disabled: bool) -> None:
    env = {} if value is None else {attn_rot.ATTN_ROT_DISABLE_ENV: value}
    assert attn_rot.attn_rot_disabled(env) is disabled
    assert attn_rot.c_atoi("  -42abc") == -42 and attn_rot.c_atoi("abc") == 0


def test_the_cache_makes_each_matrix_once_on_each_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two backends, one layer each: K's 128-matrix and V's 64-matrix on each, holding attn_rot.hadamard(n); an F16
    cache, the switch, or no head size: none."""
    monkeypatch.delenv(attn_rot.ATTN_ROT_DISABLE_ENV, raising=False)
    a, b = cpu_init(1), cpu_init(1)
    kv = KVCache(2, 8, 256, [a, b], Q8, v_trans=False, head_dim=128)
    try:
        assert (kv.n_rot_k, kv.n_rot_v) == (128, 64)
        for il, backend in enumerate((a, b)):
            k_rot, v_rot = kv.k_rot(il), kv.v_rot(il)
            assert k_rot is kv.rot[id(backend)][128] and v_rot is kv.rot[id(backend)][64]
            assert k_rot is not None and v_rot is not None
            assert k_rot.buffer is kv.k[il].buffer and v_rot.buffer is kv.k[il].buffer  # the layer's KV buffer
            for rot in (k_rot, v_rot):
                assert rot.type == F32 and np.array_equal(tensor_get_numpy(rot).reshape(rot.ne[1], rot.ne[0]),
                                                          attn_rot.hadamard(rot.ne[0]))
    finally:
        kv.free()
    for kw in ({"type": F16}, {"type": Q8, "head_dim": 0}):
        kv = KVCache(2, 8, 256, [a, b], v_trans=False, **{"head_dim": 128, **kw})  # type: ignore[arg-type]
        assert kv.k_rot(0) is None and kv.v_rot(1) is None and not any(kv.rot[id(a)])
        kv.free()
    monkeypatch.setenv(attn_rot.ATTN_ROT_DISABLE_ENV, "1")
    kv = KVCache(1, 8, 256, [a], Q8, v_trans=False, head_dim=128)
    assert kv.k_rot(0) is None and kv.v_rot(0) is None
    kv.free()


@pytest.mark.parametrize("head_dim", [-1, 48])
def test_a_head_size_that_does_not_divide_the_cell_is_refused(head_dim: int) -> None:
    with pytest.raises(ArgumentError, match=f"head_dim {head_dim} does not divide a cell of 256 values"):
        KVCache(1, 8, 256, [cpu_init(1)], Q8, v_trans=False, head_dim=head_dim)


def _layer0_cache(kv_type: str) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The builtin model's layer-0 K and V cells after PROMPT (F32 values, [n_tokens, n_embd_gqa]) with a
    `kv_type` cache and flash attention, and the sizes of its rotations."""
    model = load(builtin_model_path(), n_ctx=64, progress=False, kv_type=kv_type, kv_type_v=kv_type, flash_attn="on")
    try:
        n = len(model.eval(model.tokenize(PROMPT)))
        kv = model.kv
        cells = []
        for t in (kv.k[0], kv.v[0]):
            raw = np.empty(t.nbytes(), dtype=np.uint8)
            tensor_get(t, raw)
            cells.append(quants.to_float(t.type, raw.reshape(kv.n_ctx, -1)[:n]).reshape(n, kv.n_embd_gqa))
        return cells[0], cells[1], kv.n_rot_k, kv.n_rot_v
    finally:
        model.free()


def test_a_quantized_cache_holds_the_rotated_k_and_v(monkeypatch: pytest.MonkeyPatch) -> None:
    """Layer 0's K and V (computed before any cache is read, so the same in every run): an F16 cache holds
    them as they are; a Q8_0 cache holds H k and H v per head of 64 (un-rotated, they are the F16 cache's
    within Q8_0's rounding), and with LLAMA_ATTN_ROT_DISABLE the plain values."""
    monkeypatch.delenv(attn_rot.ATTN_ROT_DISABLE_ENV, raising=False)
    k16, v16, *rot16 = _layer0_cache("f16")
    assert rot16 == [0, 0]
    k8, v8, *rot8 = _layer0_cache("q8_0")
    assert rot8 == [64, 64]
    h = sylvester(64)

    def unrotated(x: np.ndarray) -> np.ndarray:
        return (x.reshape(-1, 64) @ h).reshape(x.shape)  # H is symmetric and its own inverse

    for name, ours, plain in (("K", k8, k16), ("V", v8, v16)):
        tol = 0.02 * np.abs(plain).max()  # Q8_0: a step of amax / 127 per block of 32
        assert np.abs(unrotated(ours) - plain).max() <= tol, name
        assert np.abs(ours - plain).max() > 10 * tol, name  # stored rotated, not as they are
    monkeypatch.setenv(attn_rot.ATTN_ROT_DISABLE_ENV, "1")
    k8, v8, *rot8 = _layer0_cache("q8_0")
    assert rot8 == [0, 0]
    for ours, plain in ((k8, k16), (v8, v16)):
        assert np.abs(ours - plain).max() <= 0.02 * np.abs(plain).max()


def test_the_rotation_is_in_the_graph_only_for_a_quantized_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per layer: Q and K by K's matrix, V and the attention's output by V's (four MUL_MATs by a rotation
    matrix, hinted SRC0_IS_HADAMARD as llama.cpp hints them); none with an F16 cache."""
    monkeypatch.delenv(attn_rot.ATTN_ROT_DISABLE_ENV, raising=False)
    for kv_type, per_layer in (("q4_0", 4), ("f16", 0)):
        model = load(builtin_model_path(), n_ctx=64, progress=False, kv_type=kv_type, kv_type_v=kv_type,
                     flash_attn="on")
        ctx = Context(mem_size=1 << 22, no_alloc=True)
        try:
            graph, _ = build_graph(ctx, model.hparams, model.w, model.kv, 4, 0, flash_attn=True)
            rots = {id(t) for m in model.kv.rot.values() for t in m.values()}
            rotations = [n for n in graph.nodes if n.op == GGMLOp.MUL_MAT and id(n.src[0]) in rots]
            assert len(rotations) == per_layer * model.hparams.n_layer, kv_type
            assert all(MulMatParams.of(n).hint is OpHint.SRC0_IS_HADAMARD for n in rotations)
        finally:
            ctx.free()
            model.free()


def test_layers_over_two_backends_rotate_with_their_own_matrices(monkeypatch: pytest.MonkeyPatch) -> None:
    """The builtin model with a Q8_0 cache, its layers over two CPU backends: each backend's layers read the
    matrices in its own KV buffer, and the logits are the one-backend model's."""
    monkeypatch.delenv(attn_rot.ATTN_ROT_DISABLE_ENV, raising=False)
    kw = {"n_ctx": 64, "progress": False, "kv_type": "q8_0", "kv_type_v": "q8_0", "flash_attn": "on"}
    one = load(builtin_model_path(), **kw)  # type: ignore[arg-type]
    a, b = cpu_init(1), cpu_init(1)
    two = load(builtin_model_path(), backends=[a, b], n_layers_on=[1], **kw)  # type: ignore[arg-type]
    try:
        ids = one.tokenize(PROMPT)
        assert two.layer_backend[0] is a and two.layer_backend[-1] is b
        for il, backend in enumerate(two.layer_backend):
            k_rot = two.kv.k_rot(il)
            assert k_rot is not None and k_rot is two.kv.rot[id(backend)][64]
        assert np.array_equal(one.eval(ids), two.eval(ids))
    finally:
        one.free()
        two.free()
