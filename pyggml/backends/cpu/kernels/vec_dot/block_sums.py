"""A 32-value block's exact integer sums of products, by the target's byte multiply-adds (AVX2, AVX512-VNNI) or
portable vector IR, and the block value readers of Q8_0 and Q4_0.
"""

from __future__ import annotations

import numba
from llvmlite import binding as llvm_binding
from llvmlite import ir

from pyggml.backends.cpu.kernels.vec_dot.ir import IR_I8, IR_I16, IR_I32, load_vector, pair_sums, shuffle


def q8_0_values(builder, p):
    """Q8_0's 32 int8 values at p."""
    return load_vector(builder, p, IR_I8, 32)


def q4_0_nibbles(builder, p):
    """Q4_0's 32 nibbles (0..15) from the 16 bytes at p, low first: the bytes twice, one copy shifted, masked."""
    q = load_vector(builder, p, IR_I8, 16)
    both = builder.shuffle_vector(q, q, ir.Constant(ir.VectorType(IR_I32, 32), list(range(16)) * 2))
    v4i64 = ir.VectorType(ir.IntType(64), 4)
    shifted = builder.lshr(builder.bitcast(both, v4i64), ir.Constant(v4i64, [0, 0, 4, 4]))
    v32i8 = ir.VectorType(IR_I8, 32)
    return builder.and_(builder.bitcast(shifted, v32i8), ir.Constant(v32i8, [15] * 32))


def block_sums_portable(builder, wv, yv):
    """8 exact int32 partial sums of the products of two <32 x i8> vectors (pairs, then halves)."""
    v32 = ir.VectorType(IR_I32, 32)
    prod = builder.mul(builder.sext(wv, v32), builder.sext(yv, v32), flags=["nsw"])
    return _pairs_then_halves(builder, prod)


def _pairs_then_halves(builder, prod):
    """8 sums of a <32 x i32>: adjacent pairs (vpmaddwd's shape), then lanes i and i + 8 of those."""
    pairs = pair_sums(builder, prod)
    return builder.add(shuffle(builder, pairs, list(range(8))), shuffle(builder, pairs, list(range(8, 16))))


def quads(builder, prod):
    """The sums of 4 consecutive lanes of an <n x i32> (lane i: elements 4i..4i+3, ggml's AVX2 layout)."""
    return pair_sums(builder, pair_sums(builder, prod))


def block_sums_quads(builder, wv, yv):
    """As block_sums_avx2 (lane i: products 4i..4i+3) in portable vector IR."""
    v32 = ir.VectorType(IR_I32, 32)
    return quads(builder, builder.mul(builder.sext(wv, v32), builder.sext(yv, v32), flags=["nsw"]))


def block_sums_unsigned_quads(builder, uv, yv):
    """As block_sums_unsigned_avx2 (lane i: products 4i..4i+3) in portable vector IR."""
    v32 = ir.VectorType(IR_I32, 32)
    return quads(builder, builder.mul(builder.zext(uv, v32), builder.sext(yv, v32), flags=["nsw"]))


def block_sums_avx2(builder, wv, yv):
    """As block_sums_portable by ggml's AVX2 vpsignb, vpmaddubsw, vpmaddwd (exact: |y| <= 127, no saturation)."""
    v32i8, v16i16, v8i32 = ir.VectorType(IR_I8, 32), ir.VectorType(IR_I16, 16), ir.VectorType(IR_I32, 8)
    module = builder.module
    absb = module.declare_intrinsic("llvm.abs.v32i8", fnty=ir.FunctionType(v32i8, [v32i8, ir.IntType(1)]))
    sign = module.declare_intrinsic("llvm.x86.avx2.psign.b", fnty=ir.FunctionType(v32i8, [v32i8, v32i8]))
    maddubs = module.declare_intrinsic("llvm.x86.avx2.pmadd.ub.sw", fnty=ir.FunctionType(v16i16, [v32i8, v32i8]))
    maddwd = module.declare_intrinsic("llvm.x86.avx2.pmadd.wd", fnty=ir.FunctionType(v8i32, [v16i16, v16i16]))
    pairs16 = builder.call(maddubs, [builder.call(absb, [wv, ir.Constant(ir.IntType(1), 0)]),
                                     builder.call(sign, [yv, wv])])
    return builder.call(maddwd, [pairs16, ir.Constant(v16i16, [1] * 16)])


def block_sums_unsigned_portable(builder, uv, yv):
    """As block_sums_portable for values read unsigned (0..255) in `uv`."""
    v32 = ir.VectorType(IR_I32, 32)
    prod = builder.mul(builder.zext(uv, v32), builder.sext(yv, v32), flags=["nsw"])
    return _pairs_then_halves(builder, prod)


def block_sums_unsigned_avx2(builder, uv, yv):
    """As block_sums_unsigned_portable by vpmaddubsw + vpmaddwd; exact for values <= 128 (Q4_0's 0..15)."""
    v32i8, v16i16, v8i32 = ir.VectorType(IR_I8, 32), ir.VectorType(IR_I16, 16), ir.VectorType(IR_I32, 8)
    module = builder.module
    maddubs = module.declare_intrinsic("llvm.x86.avx2.pmadd.ub.sw", fnty=ir.FunctionType(v16i16, [v32i8, v32i8]))
    maddwd = module.declare_intrinsic("llvm.x86.avx2.pmadd.wd", fnty=ir.FunctionType(v8i32, [v16i16, v16i16]))
    return builder.call(maddwd, [builder.call(maddubs, [uv, yv]), ir.Constant(v16i16, [1] * 16)])


def vpdpbusd(builder, acc, uv, yv):
    """acc + the sums of 4 consecutive products uv (unsigned) * yv (signed), one per lane of acc (<8 x i32> or
    <16 x i32>): AVX512-VNNI's vpdpbusd."""
    lanes = acc.type.count
    vi32 = ir.VectorType(IR_I32, lanes)
    fn = builder.module.declare_intrinsic(f"llvm.x86.avx512.vpdpbusd.{32 * lanes}",
                                          fnty=ir.FunctionType(vi32, [vi32, vi32, vi32]))
    return builder.call(fn, [acc, builder.bitcast(uv, vi32), builder.bitcast(yv, vi32)])


def block_sums_vnni(builder, wv, yv):
    """As block_sums_avx2 (|w| times y with w's sign, lane i: products 4i..4i+3) by one vpdpbusd."""
    v32i8 = ir.VectorType(IR_I8, 32)
    module = builder.module
    absb = module.declare_intrinsic("llvm.abs.v32i8", fnty=ir.FunctionType(v32i8, [v32i8, ir.IntType(1)]))
    sign = module.declare_intrinsic("llvm.x86.avx2.psign.b", fnty=ir.FunctionType(v32i8, [v32i8, v32i8]))
    zero = ir.Constant(ir.VectorType(IR_I32, 8), [0] * 8)
    return vpdpbusd(builder, zero, builder.call(absb, [wv, ir.Constant(ir.IntType(1), 0)]),
                     builder.call(sign, [yv, wv]))


def block_sums_unsigned_vnni(builder, uv, yv):
    """As block_sums_unsigned_avx2 by one vpdpbusd."""
    return vpdpbusd(builder, ir.Constant(ir.VectorType(IR_I32, 8), [0] * 8), uv, yv)


def _target_has(*features: str) -> bool:
    """Whether numba compiles for a CPU with all these LLVM features."""
    if numba.config.CPU_NAME:
        return False  # a chosen (e.g. generic) target: portable code only
    host = llvm_binding.get_host_cpu_features()
    return all(host.get(f, False) for f in features)


# the target's block sums; the generators take them as an argument, so tests run every variant the host can
HAS_AVX2 = _target_has("avx2")
HAS_VNNI = HAS_AVX2 and _target_has("avx512vnni", "avx512vl")
HAS_AVX512 = HAS_AVX2 and _target_has("avx512f", "avx512bw")


def choose_block_sums(avx2: bool, vnni: bool) -> tuple:
    """The (signed, unsigned) block sums for a target with these features."""
    if avx2 and vnni:
        return block_sums_vnni, block_sums_unsigned_vnni
    if avx2:
        return block_sums_avx2, block_sums_unsigned_avx2
    return block_sums_portable, block_sums_unsigned_portable


target_block_sums, target_block_sums_unsigned = choose_block_sums(HAS_AVX2, HAS_VNNI)
