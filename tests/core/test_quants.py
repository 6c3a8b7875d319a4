"""Row conversion between ggml types and float32 (pyggml.core.quants).

Four independent references:
- the gguf package's numpy (de)quantizers, where it has them;
- ggml's own bytes: `GOLDEN` holds SHA-256 digests of what ggml's C reference
  quantizers (type_traits' from_float_ref, quantize_row_*_ref of llama.cpp
  0c1e570's libggml-base, which is built without fused multiply-adds) write
  for `golden_input`, a signal made from integer hashing only so it never
  depends on a random generator's stream;
- the C library itself (pyggml.testing.ggml_c, through ctypes): quantize,
  dequantize and ggml_quantize_chunk of random rows and rows of edge cases,
  byte for byte (skipped only on a machine without a C compiler);
- properties written here from the block layouts (Q8_1's s, Q8_K's bsums,
  error bounds, rounding edge cases).
"""

from __future__ import annotations

import functools
import hashlib

import gguf.quants as gq
import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from pyggml.core import quants
from pyggml.core.errors import ArgumentError, GGMLError, UnsupportedTypeError
from pyggml.core.quants_iq import IQ_TYPES
from pyggml.core.types import TYPE_TRAITS, GGMLType, from_float, row_size, to_float

T = GGMLType
IMPLEMENTED = list(quants.IMPLEMENTED_TYPES)
QUANTIZED = [t for t in IMPLEMENTED if TYPE_TRAITS[t].is_quantized]
# the quantized types pyggml writes too (all but the lattice types, which only ggml_quantize_chunk writes)
WRITTEN = [t for t in quants.FROM_FLOAT_TYPES if TYPE_TRAITS[t].is_quantized]
LATTICE = list(IQ_TYPES)
PLAIN = [t for t in IMPLEMENTED if not TYPE_TRAITS[t].is_quantized]
# gguf has no Q8_1, Q8_K, K-quant or IQ4 quantizers
GGUF_QUANTIZES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.TQ1_0, T.TQ2_0, T.MXFP4]
GGUF_DEQUANTIZES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K,
                    T.Q6_K, T.IQ2_XXS, T.IQ2_XS, T.IQ3_XXS, T.IQ1_S, T.IQ4_NL, T.IQ3_S, T.IQ2_S, T.IQ4_XS, T.IQ1_M,
                    T.TQ1_0, T.TQ2_0, T.MXFP4, T.NVFP4]

# (elements, bytes) per block, from the static_asserts of ggml-common.h and ggml.c's type_traits (0c1e570)
GGML_SIZES = {
    T.F32: (1, 4), T.F16: (1, 2), T.BF16: (1, 2), T.F64: (1, 8),
    T.I8: (1, 1), T.I16: (1, 2), T.I32: (1, 4), T.I64: (1, 8),
    T.Q4_0: (32, 18), T.Q4_1: (32, 20), T.Q5_0: (32, 22), T.Q5_1: (32, 24), T.Q8_0: (32, 34), T.Q8_1: (32, 36),
    T.Q2_K: (256, 84), T.Q3_K: (256, 110), T.Q4_K: (256, 144), T.Q5_K: (256, 176), T.Q6_K: (256, 210),
    T.Q8_K: (256, 292), T.IQ2_XXS: (256, 66), T.IQ2_XS: (256, 74), T.IQ3_XXS: (256, 98), T.IQ1_S: (256, 50),
    T.IQ4_NL: (32, 18), T.IQ3_S: (256, 110), T.IQ2_S: (256, 82), T.IQ4_XS: (256, 136), T.IQ1_M: (256, 56),
    T.TQ1_0: (256, 54), T.TQ2_0: (256, 66), T.MXFP4: (32, 17), T.NVFP4: (64, 36), T.Q1_0: (128, 18), T.Q2_0: (64, 18),
}


def name(t: GGMLType) -> str:
    return t.name


def gq_type(t: GGMLType) -> GGMLQuantizationType:
    return GGMLQuantizationType(int(t))


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer (uint64 arithmetic wraps)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@functools.cache
def golden_input(n_blocks: int, bs: int) -> np.ndarray:
    """A deterministic (n_blocks, bs) float32 signal with the blocks that stress a quantizer.

    Bell-shaped values (a sum of three 21-bit uniforms, exact in float32)
    times a power-of-two scale per block; by block index mod 16 some blocks
    are on a grid of halves with a first weight of 127 (bs 32) or -128
    (bs 256), which makes Q8_0/Q8_1/Q8_K's scale 1 and their rounding meet
    exact ties; subnormal; all zero; constant; sparse; with one outlier;
    all positive; all negative; or on a grid of halves.
    """
    h = _mix(np.arange(n_blocks * bs, dtype=np.uint64))
    u = [((h >> np.uint64(21 * k)) & np.uint64(0x1FFFFF)).astype(np.int64) for k in range(3)]
    x = ((u[0] + u[1] + u[2] - 3 * (1 << 20)) / float(1 << 20)).reshape(n_blocks, bs)
    e = (_mix(np.arange(n_blocks, dtype=np.uint64) + np.uint64(7777)) % np.uint64(12)).astype(np.int64) - 8
    x = x * np.exp2(e)[:, None]
    kind = np.arange(n_blocks) % 16
    top2 = (h >> np.uint64(62)).reshape(n_blocks, bs)
    x[kind == 1] = np.clip(np.round(x[kind == 1] * 8) / 2, -100, 100)
    x[kind == 1, 0] = 127.0 if bs == 32 else -128.0
    x[kind == 2] *= 2.0**-140
    x[kind == 3] = np.copysign(0.0, x[kind == 3])  # zeros of both signs
    x[kind == 5] = x[kind == 5][:, :1]
    x[kind == 7] = np.where(top2[kind == 7] == 3, x[kind == 7], np.copysign(0.0, x[kind == 7]))  # 1 in 4 kept
    x[kind == 9, bs // 3] *= 64
    x[kind == 11] = np.abs(x[kind == 11])
    x[kind == 13] = -np.abs(x[kind == 13])
    x[kind == 15] = np.round(x[kind == 15] * 2) / 2
    x = x.astype(np.float32)
    x.flags.writeable = False
    return x


# 4M weights each: the K-quant searches take rare branches (a fifth pass of make_q3_quants,
# a last-bit difference deciding between two scales) about once in a thousand super-blocks
GOLDEN_BLOCKS = {32: 1 << 17, 256: 1 << 14}


def golden_blocks(bs: int) -> np.ndarray:
    """The golden input in blocks of bs: its own signal for 32 and 256, the 256 one's blocks split for 64 and 128."""
    if bs in GOLDEN_BLOCKS:
        return golden_input(GOLDEN_BLOCKS[bs], bs)
    return golden_input(GOLDEN_BLOCKS[256], 256).reshape(-1, bs)
GOLDEN: dict[GGMLType, str] = {}  # filled below


def sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def nmse(x: np.ndarray, y: np.ndarray) -> float:
    """Normalized mean squared error, as ggml's test-backend-ops measures it."""
    return float(np.sum((x.astype(np.float64) - y) ** 2) / np.sum(x.astype(np.float64) ** 2))


def valid_random_blocks(t: GGMLType, nb: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes for nb blocks of t, with finite random values in the float fields (d, m, s, dmin)."""
    raw = rng.integers(0, 256, (nb, TYPE_TRAITS[t].type_size), dtype=np.uint8)
    view = raw.view(quants.BLOCK_DTYPES[t]).reshape(nb)
    for name in view.dtype.names:
        if view.dtype[name].kind == "f":
            view[name] = rng.uniform(-2, 2, nb).astype(view.dtype[name])
    return raw


# --- traits -----------------------------------------------------------------------


@pytest.mark.parametrize("t", IMPLEMENTED, ids=name)
def test_traits_match_ggml_and_gguf(t: GGMLType) -> None:
    tr = TYPE_TRAITS[t]
    assert (tr.blck_size, tr.type_size) == GGML_SIZES[t]
    # the gguf package still has Q8_1's old layout (f32 d and s, 40 bytes; no file holds it), and no Q2_0
    if t not in (T.Q8_1, T.Q2_0):
        assert (tr.blck_size, tr.type_size) == tuple(GGML_QUANT_SIZES[gq_type(t)])
    assert row_size(t, 3 * tr.blck_size) == 3 * tr.type_size
    if t in quants.BLOCK_DTYPES:
        assert quants.BLOCK_DTYPES[t].itemsize == tr.type_size
        assert quants.block_dtype(t) == quants.BLOCK_DTYPES[t]


@pytest.mark.parametrize("t", QUANTIZED, ids=name)
def test_partial_blocks_are_rejected_with_the_numbers(t: GGMLType) -> None:
    tr = TYPE_TRAITS[t]
    with pytest.raises(ArgumentError, match=str(tr.blck_size + 1)):
        row_size(t, tr.blck_size + 1)
    with pytest.raises(ArgumentError, match=rf"{tr.type_size - 1}.*{tr.type_size}"):
        to_float(t, np.zeros((2, tr.type_size - 1), np.uint8))
    if t in WRITTEN:
        with pytest.raises(ArgumentError, match=rf"{tr.blck_size + 1}.*{tr.blck_size}"):
            from_float(t, np.zeros((2, tr.blck_size + 1), np.float32))
        with pytest.raises(ArgumentError):
            from_float(t, np.float32(1.0))
    with pytest.raises(UnsupportedTypeError, match="uint8"):
        to_float(t, np.zeros(tr.type_size, np.float32))


def test_block_dtype_of_a_plain_type_is_an_error() -> None:
    with pytest.raises(UnsupportedTypeError, match="f16"):
        quants.block_dtype(T.F16)
    with pytest.raises(UnsupportedTypeError):
        quants.dequantize_blocks(T.F32, np.zeros(4, np.uint8))


def test_unknown_type_is_an_error() -> None:
    with pytest.raises(UnsupportedTypeError, match="99"):
        to_float(99, np.zeros(4, np.uint8))  # type: ignore[arg-type]


# --- every type converts -------------------------------------------------------------


@pytest.mark.parametrize("t", IMPLEMENTED, ids=name)
def test_every_type_converts_to_float_keeping_leading_axes(t: GGMLType, rng: np.random.Generator) -> None:
    tr = TYPE_TRAITS[t]
    if tr.is_quantized:
        raw = valid_random_blocks(t, 2 * 3 * 2, rng).reshape(2, 3, 2 * tr.type_size)
        out = to_float(t, raw)
        assert out.dtype == np.float32 and out.shape == (2, 3, 2 * tr.blck_size)
        # a flat array of whole blocks is one row, the same values
        np.testing.assert_array_equal(to_float(t, raw.reshape(-1)), out.reshape(-1))
        np.testing.assert_array_equal(quants.dequantize_blocks(t, raw), out.reshape(-1, tr.blck_size))
        assert to_float(t, raw, n=2 * tr.blck_size).shape == out.shape
        with pytest.raises(ArgumentError, match=str(2 * tr.blck_size)):
            to_float(t, raw, n=tr.blck_size)
    else:
        vals = rng.integers(-100, 100, (2, 3, 4)).astype(np.float32)
        stored = from_float(t, vals)
        assert stored.dtype == tr.np_dtype and stored.shape == (2, 3, 4)
        out = to_float(t, stored)
        assert out.dtype == np.float32
        np.testing.assert_array_equal(out, vals)  # small integers are exact in every plain type
        np.testing.assert_array_equal(to_float(t, stored.view(np.uint8)), vals)  # raw bytes are viewed


def test_to_float_of_f32_is_a_copy() -> None:
    a = np.arange(4, dtype=np.float32)
    b = to_float(T.F32, a)
    b[0] = 7
    assert a[0] == 0


# --- against the gguf package --------------------------------------------------------


@pytest.mark.parametrize("t", GGUF_DEQUANTIZES, ids=name)
def test_to_float_equals_gguf_dequantize(t: GGMLType, rng: np.random.Generator) -> None:
    tr = TYPE_TRAITS[t]
    if tr.is_quantized:
        random_raw = valid_random_blocks(t, 64, rng).reshape(4, 16 * tr.type_size)
        x = rng.standard_normal((4, 16 * tr.blck_size)).astype(np.float32)
        quantized = from_float(t, x) if t in WRITTEN else random_raw  # the lattice types: bytes only
        for raw in (random_raw, quantized):
            # random MXFP4 exponents overflow to inf, random IQ1_M scale bits are inf or NaN (in both)
            with np.errstate(over="ignore", invalid="ignore"):
                np.testing.assert_array_equal(to_float(t, raw), gq.dequantize(raw, gq_type(t)))
    else:
        bits = rng.integers(0, 1 << (8 * tr.type_size), 300, dtype=np.uint64).astype(f"<u{tr.type_size}")
        raw = bits.view(tr.np_dtype)
        raw = raw[np.isfinite(to_float(t, raw))]
        np.testing.assert_array_equal(to_float(t, raw), gq.dequantize(raw.view(np.uint8), gq_type(t)).reshape(-1))


@pytest.mark.parametrize("t", GGUF_QUANTIZES + [T.BF16, T.F16], ids=name)
def test_from_float_equals_gguf_quantize_bytes(t: GGMLType, rng: np.random.Generator) -> None:
    x = np.concatenate([
        rng.standard_normal((64, 256)),
        rng.uniform(0, 5, (16, 256)),  # all positive: the min is not 0
        rng.standard_normal((16, 256)) * np.exp(rng.uniform(-12, 8, (16, 1))),
        np.round(rng.standard_normal((16, 256)) * 4) / 4,  # ties for the rounding
    ]).astype(np.float32)
    ours = from_float(t, x)
    theirs = gq.quantize(x, gq_type(t))
    np.testing.assert_array_equal(ours.view(np.uint8), theirs.view(np.uint8))


# --- against ggml's own bytes ------------------------------------------------------------


# digests of the C library's bytes (libggml-base of llama.cpp 0c1e570: from_float_ref, and for Q8_K, which has
# none, the CPU backend's from_float, the same reference code on x86). For IQ4_NL ggml leaves the quants of a
# block below GROUP_MAX_EPS unset (whatever its buffer held): the digest is of C's bytes with those quants set
# to 0x88, what pyggml (and ggml_quantize_chunk) write.
GOLDEN.update({
    T.Q4_0: "ed1142f125db971d61cc0732e172ce7f9bccd1938aa2086d5c0dc4951dd3a644",
    T.Q4_1: "4957f89c0b49b4a5b9b4bb051a3f55bdfaf0f9e12e4fb498b1057044ccac4afd",
    T.Q5_0: "2057b7b8be56d6bfe663d6cce46675baff37c1d1719a188fe6228a2e23237539",
    T.Q5_1: "89c288ccb67c7c7bd061e0506673f94ad32393bdea1a689a46fed4d85f030f83",
    T.Q8_0: "165b79c456104d472aadd6671df0c24ef9f7e73590b145939b1f74b4ccbd7b81",
    T.Q8_1: "d7e5bd8df48ce54b154ff580366321b6212783dead4d36c5bdc67c31f3d056a8",
    T.Q2_K: "1f98094ca16e8c232da34e40902b43d2b7d0ada430af3bba1e263d0f6c1059e6",
    T.Q3_K: "7ba9763f757a05168a3210fcc74bed6ca0b3858b9cefc1340012d9b5340d5672",
    T.Q4_K: "c4d347670944eef91d65709b7fe9fb65431f3e6593ab154acc77563ecf2836d6",
    T.Q5_K: "fdd8b1e7b906c22bd32fbaed4b7ef5712b8f0dfe09309a0a9ba88fff5c701e2b",
    T.Q6_K: "7273efc97a9072af8e0967d7a7d4e5cfd7e33dc614f3c969d78029fdb76fc5e9",
    T.Q8_K: "7c584fde3f45976904d92d61909128f5f6acbf357922eac9f0fd0f7b407e11d3",
    T.IQ4_NL: "db8bf36871170125536c1efbf5376719bcce4fcca3b54b39ae43d2771532ea4b",
    T.IQ4_XS: "a13a1a258aec3764e42ff2bd4d57e2304a40b0ee978fd1178d3448698e713935",
    T.TQ1_0: "ab3ce7196efdad2f00eb60f651d5d43b8b455dfc6a16b5b16041272089a28cc9",
    T.TQ2_0: "6543a69b20e135a5773ed4d474f3ec792a4b7204bbf4a3940dc1f31b217bea8d",
    T.MXFP4: "64cddaccfbb1eaa9dd9036005cec6405cf10f10d1fefdbb1d42d3c55677bc815",
    T.NVFP4: "5505ef621e1e90fb1c80df717b330188334f741968624a808b81f679df1cfd94",
    T.Q1_0: "f2b92142edcdd85c525925485edb601c8b5eadce9c3a69ea30e6fd0daf241d60",
    T.Q2_0: "daab5c783125214c76a0b8f32e8d5783c3f19f3d54839fea3525d957aa63757d",
})
# ggml_quantize_chunk's bytes where they are not from_float's: IQ4_NL's file quantizer
GOLDEN_CHUNK = {T.IQ4_NL: "a2bf037c8e7238b43a49a8f8f3a2122004df109c2e6cdd9f6e0fac6d5ae0d7d7"}


@pytest.mark.parametrize("t", WRITTEN, ids=name)
@pytest.mark.slow
def test_quantizers_reproduce_ggml_reference_bytes(t: GGMLType) -> None:
    x = golden_blocks(TYPE_TRAITS[t].blck_size)
    assert sha(from_float(t, x)) == GOLDEN[t]


@pytest.mark.parametrize("t", WRITTEN, ids=name)
@pytest.mark.slow
def test_quantize_chunk_reproduces_ggml_bytes(t: GGMLType) -> None:
    x = golden_blocks(TYPE_TRAITS[t].blck_size)
    if t in (T.Q8_1, T.Q8_K):  # ggml_quantize_chunk has no case for them
        with pytest.raises(UnsupportedTypeError, match=f"ggml_quantize_chunk does not convert to {t.name}"):
            quants.quantize_chunk(t, x)
        return
    assert sha(quants.quantize_chunk(t, x)) == GOLDEN_CHUNK.get(t, GOLDEN[t])


def test_golden_input_is_the_one_the_digests_were_made_from() -> None:
    # guards the digests against an accidental change of the signal
    assert sha(golden_input(GOLDEN_BLOCKS[32], 32)) == GOLDEN_INPUT_32
    assert sha(golden_input(GOLDEN_BLOCKS[256], 256)) == GOLDEN_INPUT_256


GOLDEN_INPUT_32 = "cd27d5ed2897e7fd2fa9a72b7158c494af6c61889ee946c7c013d4ad47746161"
GOLDEN_INPUT_256 = "8709b626a362e04fa256c07719571edae68c7a62335d163457ca91be70b46262"


def test_all_zero_blocks_keep_ggml_signed_zero_scales() -> None:
    # ggml starts its max search at +0, so an all-zero Q4_0 block has d = +0/-8 = -0 (0x8000);
    # Q4_1's min is the first of equal values, so a leading -0 gives m = -0
    z = np.zeros((2, 32), np.float32)
    z[1, 0] = -0.0
    q40 = from_float(T.Q4_0, z)
    assert q40[:, :2].tolist() == [[0x00, 0x80], [0x00, 0x80]]
    assert (q40[:, 2:] == 0x88).all()  # every quant is 8, i.e. 0
    q41 = from_float(T.Q4_1, z)
    assert q41[:, 2:4].tolist() == [[0x00, 0x00], [0x00, 0x80]]
    assert (to_float(T.Q4_1, q41) == 0).all()


# --- against the C library ------------------------------------------------------------------


@pytest.fixture(scope="module")
def clib() -> object:
    """The C library (libggml-base and libggml-cpu of llama.cpp 0c1e570), built if this machine lacks it."""
    from pyggml.testing import ggml_c, llamacpp

    try:
        return ggml_c.load()
    except llamacpp.NoCompilerError as e:
        pytest.skip(str(e))


def edge_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """Rows of n values (a multiple of 256), each row one kind of input that stresses a quantizer."""
    g = rng.standard_normal(n).astype(np.float32)
    p2 = np.exp2(rng.integers(-130, 120, n).astype(np.float64))
    sparse, outliers = g.copy(), g.copy()
    sparse[rng.random(n) < 0.75] = 0
    outliers[::7] *= 1000
    rows = [
        np.zeros(n), -np.zeros(n), np.full(n, 0.75), np.full(n, -3.0),  # zero (both signs), constant
        g * 1e30, g * 3e37, g * 1e-30, g * 1e-40,  # huge, tiny, subnormal
        np.round(g * 4) / 4, np.round(g * 8) / 2, rng.integers(-8, 8, n),  # ties for every rounding
        np.exp2(rng.integers(-20, 20, n)) * rng.choice([-1, 1], n),  # powers of two: MXFP4's log2 at its edges
        p2 * (1 - 2.0**-24 * rng.integers(0, 4, n)), p2 * (1 + 2.0**-23 * rng.integers(0, 4, n)),
        sparse, outliers, np.abs(g), -np.abs(g), rng.uniform(1, 2, n), g * np.exp2(rng.integers(-12, 12, n)),
    ]
    return np.stack(rows).astype(np.float32)


def c_input(rng: np.random.Generator) -> np.ndarray:
    """Random rows and rows of edge cases, 1024 wide."""
    return np.concatenate([rng.standard_normal((8, 1024)).astype(np.float32)] +
                          [edge_rows(rng, 1024) for _ in range(4)])


def tiny_blocks(x: np.ndarray, bs: int) -> np.ndarray:
    """Which blocks of bs values are below ggml's GROUP_MAX_EPS (their IQ4_NL quants C leaves unset)."""
    return np.abs(x.reshape(-1, bs)).max(axis=1) < quants.GROUP_MAX_EPS


@pytest.mark.parametrize("t", WRITTEN + [T.F16, T.BF16], ids=name)
def test_from_float_is_the_c_librarys(t: GGMLType, clib: object, rng: np.random.Generator) -> None:
    from pyggml.testing import ggml_c

    tr = TYPE_TRAITS[t]
    x = c_input(rng)
    ours = np.ascontiguousarray(from_float(t, x)).view(np.uint8).reshape(-1, tr.type_size)
    # Q8_K has no from_float_ref: the CPU backend's (the same reference code on x86) is its converter
    theirs = ggml_c.c_from_float(t, x, cpu=t == T.Q8_K).reshape(-1, tr.type_size)
    if t == T.IQ4_NL:
        tiny = tiny_blocks(x, 32)
        assert tiny.sum() > 100 and (ours[tiny, :2] == 0).all() and (ours[tiny, 2:] == 0x88).all()
        theirs[tiny, 2:] = 0x88
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("t", [q for q in WRITTEN if q not in (T.Q8_1, T.Q8_K)], ids=name)
def test_quantize_chunk_is_the_c_librarys(t: GGMLType, clib: object, rng: np.random.Generator) -> None:
    from pyggml.testing import ggml_c

    x = c_input(rng)
    np.testing.assert_array_equal(quants.quantize_chunk(t, x), ggml_c.c_quantize_chunk(t, x))


@pytest.mark.parametrize("t", [q for q in QUANTIZED if q not in (T.Q8_1, T.Q8_K)] + [T.F16, T.BF16], ids=name)
def test_to_float_is_the_c_librarys(t: GGMLType, clib: object, rng: np.random.Generator) -> None:
    from pyggml.testing import ggml_c

    tr = TYPE_TRAITS[t]
    if tr.is_quantized:
        if t in WRITTEN:
            quantized = from_float(t, c_input(rng))
        else:  # C's file quantizer writes them (with an importance matrix: some need one); it asserts on edge rows
            x = rng.standard_normal((8, 1024)).astype(np.float32) * np.exp2(rng.integers(-8, 8, (8, 1)))
            quantized = ggml_c.c_quantize_chunk(t, x.astype(np.float32),
                                                imatrix=rng.uniform(0.5, 2, 1024).astype(np.float32))
        raws = [valid_random_blocks(t, 256, rng).reshape(8, -1), quantized]
        if t == T.MXFP4:  # every exponent, subnormal scales and inf included
            raws[0].reshape(-1, 17)[:, 0] = np.arange(256)
    else:
        raws = [rng.integers(0, 1 << 16, (8, 512), dtype=np.uint64).astype(np.uint16).view(np.uint8)]
    for raw in raws:
        with np.errstate(over="ignore"):
            ours = to_float(t, raw)
        np.testing.assert_array_equal(ours, ggml_c.c_to_float(t, raw))


# --- the vec-dot types Q8_1 and Q8_K (no gguf quantizer) ------------------------------------


def test_q8_1_layout_and_sum(rng: np.random.Generator) -> None:
    x = rng.standard_normal((8, 32 * 16)).astype(np.float32)
    x[0, :32] = 0
    raw = quants.quantize_q8_1(x)
    np.testing.assert_array_equal(raw, from_float(T.Q8_1, x))
    blocks = raw.reshape(-1).view(quants.BLOCK_DTYPES[T.Q8_1])
    xb = x.reshape(-1, 32)
    d = np.abs(xb).max(axis=1) / np.float32(127)  # stored as f16; s = sum(qs) * d from the unrounded d
    np.testing.assert_array_equal(blocks["d"], d.astype(np.float16))
    np.testing.assert_array_equal(blocks["s"], (blocks["qs"].astype(np.int32).sum(axis=1).astype(np.float32)
                                                * d).astype(np.float16))
    assert blocks["d"][0] == 0 and (blocks["qs"][0] == 0).all()
    # quants are round(x/d) half away from zero, within +-127, and the largest magnitude is +-127
    q = blocks["qs"].astype(np.int32)
    assert np.abs(q).max() == 127 and (np.abs(q[1:]).max(axis=1) == 127).all()
    back = to_float(T.Q8_1, raw)
    np.testing.assert_array_equal(back.reshape(-1, 32), q.astype(np.float32) * blocks["d"].astype(np.float32)[:, None])
    # half a step, plus the f16 rounding of d (2^-11 relative) times at most 127
    assert (np.abs(back - x).reshape(-1, 32) <= d[:, None] * (0.5 + 127 * 2.0**-11)).all()


def test_q8_1_and_q8_0_share_their_quants(rng: np.random.Generator) -> None:
    x = rng.standard_normal((4, 256)).astype(np.float32)
    q8_0 = quants.quantize_q8_0(x).reshape(-1).view(quants.BLOCK_DTYPES[T.Q8_0])
    q8_1 = quants.quantize_q8_1(x).reshape(-1).view(quants.BLOCK_DTYPES[T.Q8_1])
    np.testing.assert_array_equal(q8_0["qs"], q8_1["qs"])
    np.testing.assert_array_equal(q8_0["d"], q8_1["d"])


def test_q8_k_layout_and_bsums(rng: np.random.Generator) -> None:
    x = rng.standard_normal((3, 512)).astype(np.float32)
    x[1, :256] = 0
    x[2, 300] = -50.0  # the largest magnitude is negative: it maps to -127 (-128 until 2024)
    raw = quants.quantize_q8_K(x)
    np.testing.assert_array_equal(raw, from_float(T.Q8_K, x))
    blocks = raw.reshape(-1).view(quants.BLOCK_DTYPES[T.Q8_K])
    q = blocks["qs"].astype(np.int32)
    np.testing.assert_array_equal(blocks["bsums"], q.reshape(-1, 16, 16).sum(axis=2))
    assert blocks["d"][2] == 0 and (q[2] == 0).all() and (blocks["bsums"][2] == 0).all()
    assert q[5, 300 - 256] == -127
    xb = x.reshape(-1, 256)
    mx = xb[np.arange(6), np.abs(xb).argmax(axis=1)]
    live = mx != 0
    np.testing.assert_array_equal(blocks["d"][live], np.float32(1) / (np.float32(-127) / mx[live]))
    back = to_float(T.Q8_K, raw).reshape(-1, 256)
    np.testing.assert_array_equal(back, q.astype(np.float32) * blocks["d"][:, None])
    assert (np.abs(back - xb) <= np.abs(blocks["d"])[:, None] * 0.5 * (1 + 1e-5)).all()


# --- round trips of the K-quants (no gguf quantizer) -------------------------------------


# upper bounds of the normalized MSE of a round trip of Gaussian data, about 1.3x what these
# quantizers (whose bytes are ggml's) give; each extra bit should divide it by about 4
K_NMSE = {T.Q2_K: 0.11, T.Q3_K: 0.03, T.Q4_K: 0.0065, T.Q5_K: 0.0017, T.Q6_K: 0.0004, T.Q8_K: 6e-5,
          T.Q4_0: 0.0095, T.Q4_1: 0.008, T.Q5_0: 0.0024, T.Q5_1: 0.0019, T.Q8_0: 3.7e-5, T.Q8_1: 3.8e-5,
          T.IQ4_NL: 0.0081, T.IQ4_XS: 0.0077, T.MXFP4: 0.0175}


@pytest.mark.parametrize("t", list(K_NMSE), ids=name)
def test_round_trip_error_fits_the_bit_width(t: GGMLType, rng: np.random.Generator) -> None:
    x = rng.standard_normal((16, 4096)).astype(np.float32)
    back = to_float(t, from_float(t, x))
    err = nmse(x, back)
    assert K_NMSE[t] / 2 < err < K_NMSE[t]  # a far smaller error would mean the bytes are not the type's


@pytest.mark.parametrize("t", [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K], ids=name)
def test_k_quants_of_special_blocks(t: GGMLType, rng: np.random.Generator) -> None:
    x = np.zeros((4, 256), np.float32)
    x[1] = 0.75  # constant
    x[2, ::7] = rng.standard_normal(37).astype(np.float32)  # sparse
    x[3] = rng.uniform(1, 2, 256).astype(np.float32)  # all positive, far from 0
    back = to_float(t, from_float(t, x))
    assert (back[0] == 0).all()
    assert nmse(x[1:], back[1:]) < K_NMSE[t] * 2
    # re-quantizing the dequantized values is stable: a valid block round-trips to nearly itself
    again = to_float(t, from_float(t, back))
    assert nmse(back[1:], again[1:]) < K_NMSE[t]


@pytest.mark.parametrize("t", [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K], ids=name)
def test_k_quant_blocks_are_self_consistent(t: GGMLType, rng: np.random.Generator) -> None:
    """The quants decode with the scales that were stored (dequantize(x) is what x quantized to)."""
    x = rng.standard_normal((8, 256)).astype(np.float32) * np.float32(3)
    raw = from_float(t, x)
    blocks = raw.reshape(-1).view(quants.BLOCK_DTYPES[t])
    back = to_float(t, raw)
    d = blocks["d"].astype(np.float32)
    assert (d > 0).all() if t in (T.Q2_K, T.Q4_K, T.Q5_K) else (d != 0).all()
    # every dequantized value is within one quantization step of the input
    step = {T.Q2_K: 3, T.Q3_K: 4, T.Q4_K: 15, T.Q5_K: 31, T.Q6_K: 32}[t]
    spread = np.abs(x).max(axis=1, keepdims=True)
    assert (np.abs(back - x) <= 2 * spread / step).all()


# --- the vec-dot helpers ---------------------------------------------------------------


def test_vec_dot_helpers_are_from_float() -> None:
    x = golden_input(8, 256).reshape(2, 1024)
    np.testing.assert_array_equal(quants.quantize_q8_0(x), from_float(T.Q8_0, x))
    np.testing.assert_array_equal(quants.quantize_q8_1(x), from_float(T.Q8_1, x))
    np.testing.assert_array_equal(quants.quantize_q8_K(x), from_float(T.Q8_K, x))
    assert quants.quantize_q8_0(x).shape == (2, 1024 // 32 * 34)
    np.testing.assert_array_equal(quants.quantize_blocks(T.Q8_0, x), quants.quantize_q8_0(x).reshape(-1, 34))


def test_large_inputs_are_converted_in_pieces_with_the_same_result() -> None:
    x = golden_input(2 * quants._CHUNK_ELEMS // 256 + 3, 256)
    for t in (T.Q8_0, T.Q4_K):
        whole = np.concatenate([quants.quantize_blocks(t, x[i : i + 100]) for i in range(0, len(x), 100)])
        np.testing.assert_array_equal(quants.quantize_blocks(t, x), whole)
        np.testing.assert_array_equal(quants.dequantize_blocks(t, whole),
                                      np.concatenate([quants.dequantize_blocks(t, whole[i : i + 100])
                                                      for i in range(0, len(whole), 100)]))


# --- BF16 and F16 rounding ------------------------------------------------------------------


def f32_of_bits(*bits: int) -> np.ndarray:
    return np.array(bits, np.uint32).view(np.float32)


def test_bf16_rounds_to_nearest_even_on_the_bits() -> None:
    x = f32_of_bits(
        0x3F800000,  # 1.0
        0x3F808000,  # halfway between 0x3F80 and 0x3F81: to the even 0x3F80
        0x3F818000,  # halfway between 0x3F81 and 0x3F82: to the even 0x3F82
        0x3F808001,  # just above halfway: up
        0x3F807FFF,  # just below halfway: down
        0x80000000,  # -0
        0x00008000,  # subnormal tie: to the even 0
        0x00018000,  # subnormal tie: to the even 2
        0x7F7FFFFF,  # FLT_MAX rounds up to inf, as ggml does
        0x7F800000,  # inf
        0xFF800000,  # -inf
        0xC0490FDB,  # -pi
    )
    want = [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x3F80, 0x8000, 0x0000, 0x0002, 0x7F80, 0x7F80, 0xFF80, 0xC049]
    got = from_float(T.BF16, x)
    assert got.dtype == np.uint16
    assert got.tolist() == want


def test_bf16_keeps_nan_and_makes_it_quiet() -> None:
    x = f32_of_bits(0x7F800001, 0x7F80FFFF, 0xFFC00000, 0x7FFFFFFF, 0xFF812345)
    got = from_float(T.BF16, x)
    # (bits >> 16) | 0x40: a signalling NaN whose payload is all in the low half would otherwise become inf
    assert got.tolist() == [0x7FC0, 0x7FC0, 0xFFC0, 0x7FFF, 0xFFC1]
    assert np.isnan(to_float(T.BF16, got)).all()


def test_bf16_to_float_is_exact() -> None:
    bits = np.arange(0, 1 << 16, 7, dtype=np.uint16)
    out = to_float(T.BF16, bits)
    np.testing.assert_array_equal(out.view(np.uint32), bits.astype(np.uint32) << 16)


def test_f16_rounds_to_nearest_even() -> None:
    x = np.array([
        1 + 2.0**-11,  # halfway between 1 and 1 + 2^-10: to 1
        1 + 3 * 2.0**-11,  # halfway: to the even 1 + 2^-9
        65504.0,  # the largest f16
        65519.0,  # rounds down to 65504
        65520.0,  # halfway to 2^16: overflows to inf
        2.0**-25,  # halfway between 0 and the smallest subnormal: to 0
        3 * 2.0**-25,  # halfway between 2^-24 and 2^-23: to 2^-23
        -0.0,
    ], np.float32)
    got = from_float(T.F16, x)
    assert got.dtype == np.float16
    assert got.view(np.uint16).tolist() == [0x3C00, 0x3C02, 0x7BFF, 0x7BFF, 0x7C00, 0x0000, 0x0002, 0x8000]
    np.testing.assert_array_equal(to_float(T.F16, got)[:3], [1.0, 1 + 2.0**-9, 65504.0])


def test_integer_types_are_a_plain_cast() -> None:
    x = np.array([1.9, -1.9, 100.5, -0.0], np.float32)
    for t, dt in ((T.I8, np.int8), (T.I16, np.int16), (T.I32, np.int32), (T.I64, np.int64)):
        got = from_float(t, x)
        assert got.dtype == dt
        assert got.tolist() == [1, -1, 100, 0]
    assert from_float(T.F64, x).dtype == np.float64


# --- the lattice types (IQ2/IQ3/IQ1): read, not written ---------------------------------------


@pytest.mark.parametrize("t", LATTICE, ids=name)
def test_lattice_types_are_not_written_and_say_why(t: GGMLType) -> None:
    x = np.zeros((2, 256), np.float32)
    for fn in (from_float, quants.quantize_chunk, quants.quantize_blocks):
        with pytest.raises(UnsupportedTypeError, match=rf"ggml's CPU has no from_float for {t.name}") as e:
            fn(t, x)
        assert ("importance matrix" in str(e.value)) == (t in (T.IQ2_XXS, T.IQ2_XS, T.IQ1_S))
    assert t not in quants.FROM_FLOAT_TYPES and quants.is_implemented(t)


@pytest.mark.parametrize("t", LATTICE, ids=name)
def test_lattice_imatrix_need_is_the_c_librarys(t: GGMLType, clib: object) -> None:
    """IQType.requires_imatrix is ggml_quantize_requires_imatrix: C's file quantizer refuses those types alone."""
    from pyggml.testing import ggml_c

    x = np.ones((1, 256), np.float32)
    if IQ_TYPES[t].requires_imatrix:
        with pytest.raises(ArgumentError, match="needs an importance matrix"):
            ggml_c.c_quantize_chunk(t, x)
    else:
        assert ggml_c.c_quantize_chunk(t, x).shape == (1, TYPE_TRAITS[t].type_size)


def test_the_grids_are_lattices() -> None:
    """The grids' coordinates are ggml's few values, and ksigns_iq2xs gives 7 sign bits an eighth of even parity."""
    from pyggml.core import iq_grids as g

    want = {"IQ2XXS_GRID": ((256, 8), {8, 25, 43}), "IQ2XS_GRID": ((512, 8), {8, 25, 43}),
            "IQ2S_GRID": ((1024, 8), {8, 25, 43}), "IQ3XXS_GRID": ((256, 4), {4, 12, 20, 28, 36, 44, 52, 62}),
            "IQ3S_GRID": ((512, 4), {1, 3, 5, 7, 9, 11, 13, 15}), "IQ1S_GRID": ((2048, 8), {-1, 0, 1})}
    for grid, (shape, values) in want.items():
        points = getattr(g, grid)
        assert points.shape == shape and set(np.unique(points).tolist()) == values, grid
        assert len(np.unique(points, axis=0)) == shape[0], grid  # distinct points
    k = g.KSIGNS_IQ2XS.astype(np.int64)
    assert (k & 127).tolist() == list(range(128))
    assert all(bin(v).count("1") % 2 == 0 for v in k.tolist())
    assert g.KMASK_IQ2XS.tolist() == [1 << j for j in range(8)]


@pytest.mark.interop
def test_the_grids_file_is_ggml_common_h() -> None:
    """pyggml/data/iq_grids.npz holds exactly the tables of llama.cpp 0c1e570's ggml-common.h."""
    import runpy
    from pathlib import Path

    from pyggml.core import iq_grids
    from pyggml.testing import llamacpp

    make = runpy.run_path(str(Path(__file__).resolve().parents[2] / "tools" / "make_iq_grids.py"))
    header = llamacpp.source_file(make["HEADER_IN_SOURCE"]).read_text(encoding="utf-8")
    with np.load(iq_grids.GRIDS_FILE) as stored:
        assert sorted(stored.files) == sorted(make["TABLES"])
        for table, dtype in make["TABLES"].items():
            got = stored[table]
            assert got.dtype == dtype
            np.testing.assert_array_equal(got, make["read_table"](header, table, dtype))


def test_lattice_blocks_decode_by_their_layout() -> None:
    """Blocks built by hand from ggml-common.h's layouts: IQ2_XXS (grid indices, 7-bit sign indices, 4-bit scale)
    and IQ1_M (d spread over the top nibbles of its four u16 scales)."""
    from pyggml.core import iq_grids as g

    b = np.zeros(66, np.uint8)
    b[0:2] = np.array([2.0], "<f2").view(np.uint8)
    b[2:6] = [1, 0, 0, 0]  # sub-block 0: group 0 is grid point 1
    b[6:10] = np.array([(3 << 28) | 1], "<u4").view(np.uint8)  # scale 3, group 0's signs ksigns[1] = 129
    x = to_float(T.IQ2_XXS, b)
    db = 2.0 * (0.5 + 3) * 0.25
    sign = np.where(np.array([129 >> j & 1 for j in range(8)]), -1, 1)
    np.testing.assert_array_equal(x[:8], db * g.IQ2XXS_GRID[1] * sign)
    np.testing.assert_array_equal(x[8:32], np.tile(db * g.IQ2XXS_GRID[0], 3))
    np.testing.assert_array_equal(x[32:], np.tile(2.0 * 0.5 * 0.25 * g.IQ2XXS_GRID[0], 28))

    m = np.zeros(56, np.uint8)
    d_bits = int(np.array([0.5], "<f2").view("<u2")[0])
    sc = np.array([(d_bits & 0xF) << 12, ((d_bits >> 4) & 0xF) << 12, ((d_bits >> 8) & 0xF) << 12,
                   (d_bits >> 12) << 12], "<u2")
    sc[0] |= 2 | (5 << 3)  # sub-block 0: scales 2 (groups 0-1) and 5 (groups 2-3)
    m[48:56] = sc.view(np.uint8)
    m[32] = 0x8  # sub-block 0, group 0: shift -1/8
    x = to_float(T.IQ1_M, m)
    p0 = g.IQ1S_GRID[0].astype(np.float64)
    np.testing.assert_array_equal(x[:8], 0.5 * 5 * (p0 - 0.125))
    np.testing.assert_array_equal(x[8:16], 0.5 * 5 * (p0 + 0.125))
    np.testing.assert_array_equal(x[16:32], np.tile(0.5 * 11 * (p0 + 0.125), 2))
    np.testing.assert_array_equal(x[32:], np.tile(0.5 * 1 * (p0 + 0.125), 28))


def test_errors_are_ggml_errors() -> None:
    with pytest.raises(GGMLError):
        from_float(T.Q4_0, np.zeros(31, np.float32))
    with pytest.raises(ValueError):
        from_float(T.Q4_0, np.zeros(31, np.float32))
