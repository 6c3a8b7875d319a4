"""Atomics on int64 array elements, spin-wait hints, and operands by address (so a worker spinning in native code
starts a job without the GIL), for numba kernels shared between threads."""

from __future__ import annotations

import numpy as np
from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_X86 = llvm_binding.get_process_triple().startswith(("x86_64", "i386", "i686"))


def element_pointer(context, builder, arrty, arr, i):
    """Pointer to element `i` of a C-contiguous array (flat index)."""
    a = context.make_array(arrty)(context, builder, value=arr)
    return builder.gep(a.data, [i])


@intrinsic
def atomic_add(typingctx, a, i, v):
    """Atomically add `v` to int64 element `i` of `a`; returns the value before (sequentially consistent)."""
    sig = types.int64(a, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        p = element_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.atomic_rmw("add", p, args[2], "seq_cst")

    return sig, codegen


@intrinsic
def atomic_load(typingctx, a, i):
    """Int64 element `i` of `a`, read atomically (acquire): a loop polling it is not optimized away."""
    sig = types.int64(a, types.intp)

    def codegen(context, builder, signature, args):
        p = element_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.load_atomic(p, "acquire", 8)

    return sig, codegen


@intrinsic
def atomic_store(typingctx, a, i, v):
    """Store `v` in int64 element `i` of `a` atomically (release: the writes before it are seen first)."""
    sig = types.void(a, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        p = element_pointer(context, builder, signature.args[0], args[0], args[1])
        builder.store_atomic(args[2], p, "release", 8)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def atomic_cas(typingctx, a, i, expected, new):
    """If int64 element `i` of `a` is `expected`, make it `new`, atomically; returns the value before."""
    sig = types.int64(a, types.intp, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        p = element_pointer(context, builder, signature.args[0], args[0], args[1])
        pair = builder.cmpxchg(p, args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 0)

    return sig, codegen


@intrinsic
def spin_pause(typingctx):
    """x86's `pause` (the polling core yields to its sibling); nothing elsewhere."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        if _X86:
            fn = builder.module.declare_intrinsic("llvm.x86.sse2.pause", fnty=ir.FunctionType(ir.VoidType(), []))
            builder.call(fn, [])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def yield_cpu(typingctx):
    """sched_yield(2): a poll loop leaves the core to other ready threads now and then."""
    sig = types.int32()

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(32), [])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "sched_yield")
        return builder.call(fn, [])

    return sig, codegen


@intrinsic
def sleep_us(typingctx, us):
    """usleep(3): a waiter frees the core its descheduled partner could run on."""
    sig = types.int32(types.int64)

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "usleep")
        return builder.call(fn, [builder.trunc(args[0], ir.IntType(32))])

    return sig, codegen


@intrinsic
def cycle_counter(typingctx):
    """The CPU's cycle counter (llvm.readcyclecounter: rdtsc on x86): timestamps a profile takes in native code."""
    sig = types.int64()

    def codegen(context, builder, signature, args):
        fn = builder.module.declare_intrinsic("llvm.readcyclecounter", fnty=ir.FunctionType(ir.IntType(64), []))
        return builder.call(fn, [])

    return sig, codegen


def _pointer_intrinsic(element: types.Type):
    @intrinsic
    def pointer(typingctx, addr):
        sig = types.CPointer(element)(types.int64)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

        return sig, codegen

    pointer.__doc__ = f"The address `addr` as a {element} pointer (for numba.carray)."
    return pointer


pointer_u8 = _pointer_intrinsic(types.uint8)
pointer_i8 = _pointer_intrinsic(types.int8)
pointer_u16 = _pointer_intrinsic(types.uint16)
pointer_i32 = _pointer_intrinsic(types.int32)
pointer_i64 = _pointer_intrinsic(types.int64)
pointer_f32 = _pointer_intrinsic(types.float32)


def address(a: np.ndarray) -> int:
    """The address of `a`'s first element (the array must stay alive while a job uses it)."""
    return int(a.__array_interface__["data"][0])
