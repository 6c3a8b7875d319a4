"""Real ggml (C) as a test oracle: the same graph built and computed by llama.cpp's libggml.

The libraries are llama.cpp 0c1e570's libggml-base and libggml-cpu, built once
per machine by `pyggml.testing.llamacpp` (`require_libs`), loaded with ctypes.

A pyggml graph is rebuilt in C generically, the way ggml's RPC server
deserializes one (ggml-rpc.cpp: deserialize_tensor, create_node,
graph_compute): each tensor becomes a `ggml_new_tensor` of a `no_alloc`
context whose struct fields are then filled from the pyggml tensor (type, ne,
nb, op, the raw op_params words, flags, src, view_src, view_offs, name, data),
the graph's nodes are added in pyggml's order and the CPU backend computes
them. Op, type and flag numbers are mapped by *name* to the values ggml.h
declares (`parse_enums`), so the mapping is right whatever numbering pyggml
uses; op_params are passed through untouched (pyggml's enums and op_params
layouts are this ggml's; `ENUM_OP_PARAMS` could translate enum words by
name), so an op whose parameters differ shows up as a failed comparison,
which is the point of an oracle.

Memory: every storage tensor (one without `view_src`) gets fresh C-side memory;
inputs (tensors the graph does not compute) are copied into it from pyggml's
memory, computed ones start zeroed, views point into their source's memory at
`view_offs`. pyggml's own memory is never written by C.

C's asserts abort the process. So by default (`isolate=True`) the C part runs
in a forked child: a GGML_ASSERT, a crash or a hang becomes a `GGMLCError`
carrying ggml's message, not the death of the test session.

Entry points: `compute_like(tensor)` (the C result of the graph ending in
`tensor`, as `tensor_get_numpy` would give it), `GGMLCBackend` (a pyggml
backend named "ggml-c": CPU host buffers, graphs computed by C), and
`parse_enums` (ggml.h's enums, names to values).
"""

from __future__ import annotations

import ast
import ctypes
import faulthandler
import functools
import logging
import math
import mmap
import os
import re
import signal
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np

from pyggml.backends.cpu.backend import GGML_MAX_N_THREADS, CPUBackend
from pyggml.core import memory
from pyggml.core.checks import check_int
from pyggml.core.errors import (
    ArgumentError,
    GGMLError,
    NotAllocatedError,
    OutOfBoundsError,
    UnsupportedOpError,
    UnsupportedTypeError,
)
from pyggml.core.graph import Graph
from pyggml.core.tensor import (
    GGML_MAX_DIMS,
    GGML_MAX_NAME,
    GGML_MAX_OP_PARAMS,
    GGML_MAX_SRC,
    GGMLOp,
    Tensor,
    TensorFlag,
    is_view_op,
    shape_str,
)
from pyggml.core.types import TYPE_TRAITS, GGMLType
from pyggml.ggml_backend.buffer import tensor_buffer
from pyggml.ggml_backend.tensor_io import numpy_shape, tensor_get, tensor_set
from pyggml.testing import llamacpp

__all__ = [
    "ENUM_OP_PARAMS",
    "PYTHON_ONLY_OPS",
    "CObject",
    "CTensor",
    "GGMLCBackend",
    "GGMLCError",
    "GGMLLib",
    "MulMatInBuft",
    "c_enums",
    "c_flags",
    "c_op",
    "c_op_params",
    "c_type",
    "compute_like",
    "compute_nodes",
    "extra_bufts",
    "eval_c_int",
    "forward_nodes",
    "ggml_c_init",
    "header_struct",
    "header_text",
    "load",
    "mul_mat_repacked",
    "parse_defines",
    "parse_enums",
]

log = logging.getLogger("pyggml.testing.ggml_c")

_ALIGN = 64  # C-side tensor memory alignment (ggml's CPU buffers align to 32; SIMD loads like more)
_SLACK = 64  # bytes past each storage block, in case a kernel reads a vector beyond the last element
DEFAULT_TIMEOUT = 120.0  # seconds a forked C compute may take before it is killed


class GGMLCError(GGMLError, RuntimeError):
    """ggml's C code failed: an assert aborted it, it crashed, hung, or returned a failed status."""


# --- ggml.h: enums, #defines, struct layout ---


_TOKENS = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/', re.S)
_PREPROCESSOR = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)  # a directive, with its continued lines
_ENUM = re.compile(r"\benum\s+([A-Za-z_]\w*)\s*\{([^{}]*)\}")
_MEMBER = re.compile(r"([A-Za-z_]\w*)\s*(?:=\s*(.+))?", re.S)
_INT_LITERAL = re.compile(r"\b(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9]\d*)[uUlL]*\b")


def _strip_comments(text: str) -> str:
    """C text without comments and with every string literal emptied (a "//" or an "enum x {...}" inside a
    string is neither a comment nor an enum); char literals are kept."""
    def keep(m: re.Match[str]) -> str:
        token = m.group(0)
        return '""' if token[0] == '"' else token if token[0] == "'" else " "

    return _TOKENS.sub(keep, text)


def _c_int_literals(expr: str) -> str:
    """C integer literals (hex, octal, suffixes u/l) as Python decimal literals."""
    def convert(m: re.Match[str]) -> str:
        s = m.group(1)
        if s[:2] in ("0x", "0X"):
            return str(int(s, 16))
        return str(int(s, 8) if len(s) > 1 and s[0] == "0" else int(s))

    return _INT_LITERAL.sub(convert, expr)


_BINOPS: dict[type[ast.operator], Callable[[int, int], int]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: int(a / b) if abs(a) < 2**52 and abs(b) < 2**52 else (abs(a) // abs(b)) * (
        1 if (a >= 0) == (b >= 0) else -1),  # C truncates toward zero
    ast.Mod: lambda a, b: a - b * int(a / b),
    ast.LShift: lambda a, b: a << b,
    ast.RShift: lambda a, b: a >> b,
    ast.BitOr: lambda a, b: a | b,
    ast.BitAnd: lambda a, b: a & b,
    ast.BitXor: lambda a, b: a ^ b,
}
_UNARYOPS: dict[type[ast.unaryop], Callable[[int], int]] = {
    ast.USub: lambda a: -a,
    ast.UAdd: lambda a: a,
    ast.Invert: lambda a: ~a,
}


def eval_c_int(expr: str, names: Mapping[str, int], what: str) -> int:
    """The value of a C integer constant expression: literals, + - * / % << >> | & ^ ~, parentheses,
    and `names` (earlier enum members, #defines). ArgumentError names `what` if it is anything else."""
    try:
        tree = ast.parse(_c_int_literals(expr.strip()), mode="eval")
    except SyntaxError:
        raise ArgumentError(f"{what}: cannot parse the C expression {expr.strip()!r}") from None

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise ArgumentError(f"{what}: {node.id!r} in {expr.strip()!r} is not a known constant")
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            right = ev(node.right)
            if isinstance(node.op, (ast.Div, ast.Mod)) and right == 0:
                raise ArgumentError(f"{what}: division by zero in {expr.strip()!r}")
            return _BINOPS[type(node.op)](ev(node.left), right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARYOPS:
            return _UNARYOPS[type(node.op)](ev(node.operand))
        raise ArgumentError(f"{what}: {expr.strip()!r} is not an integer constant expression")

    return ev(tree)


def parse_enums(ggml_h_text: str, prefix: str = "ggml_") -> dict[str, dict[str, int]]:
    """The named enums of a C header (by default those named `ggml_*`), each as {member: value}.

    Handles what ggml.h uses: implicit values (0 for the first member, the
    previous one plus 1 after), explicit values, constant expressions
    (`1 << 2`, `0x10`, `-1`, `(1 << 8) | 3`) including references to earlier
    members of any enum of the header, trailing commas, and comments anywhere
    (a commented-out member like `// GGML_TYPE_Q4_2 = 4,` is not a member).
    Preprocessor lines are ignored; #define values are not substituted
    (ggml.h's enums do not use them). Members keep the header's order, so the
    `*_COUNT` member of an enum equals the number of members before it when the
    values run 0, 1, 2, ...

    Raises ArgumentError naming the enum and the member if a value is not an
    integer constant expression.

        >>> parse_enums("enum ggml_x { A, B = 1 << 2, C, /* D, */ E = B + 1 };")
        {'ggml_x': {'A': 0, 'B': 4, 'C': 5, 'E': 5}}
    """
    text = _PREPROCESSOR.sub(" ", _strip_comments(ggml_h_text))
    enums: dict[str, dict[str, int]] = {}
    known: dict[str, int] = {}  # enumerators share one scope in C: a value may name any earlier one
    for m in _ENUM.finditer(text):
        name, body = m.group(1), m.group(2)
        if not name.startswith(prefix):
            continue
        members: dict[str, int] = {}
        value = -1
        for item in body.split(","):
            if not item.strip():
                continue  # the trailing comma
            mm = _MEMBER.fullmatch(item.strip())
            if mm is None:
                raise ArgumentError(f"enum {name}: cannot parse the member {item.strip()!r}")
            member, expr = mm.group(1), mm.group(2)
            value = eval_c_int(expr, known, f"enum {name}: {member}") if expr is not None else value + 1
            members[member] = value
            known[member] = value
        enums[name] = members
    return enums


_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t]+([^\n]+)$", re.M)


def parse_defines(ggml_h_text: str) -> dict[str, int]:
    """The object-like #defines of a header whose value is an integer constant expression (GGML_MAX_DIMS,
    GGML_MAX_OP_PARAMS, ...). Where a name is defined twice (#if branches) the first definition wins."""
    out: dict[str, int] = {}
    for m in _DEFINE.finditer(_strip_comments(ggml_h_text)):
        name, expr = m.group(1), m.group(2).strip()
        if name in out:
            continue
        try:
            out[name] = eval_c_int(expr, out, f"#define {name}")
        except ArgumentError:
            continue  # a string, a macro call, a type: not a number
    return out


_CTYPES_OF: dict[str, Any] = {
    "int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32, "uint64_t": ctypes.c_uint64,
    "uint32_t": ctypes.c_uint32, "size_t": ctypes.c_size_t, "char": ctypes.c_char, "bool": ctypes.c_bool,
    "int": ctypes.c_int, "float": ctypes.c_float,
}
_SIZEOF = re.compile(r"sizeof\s*\(\s*(\w+)\s*\)")
_FIELD = re.compile(r"^(?P<type>[\w\s]+?)\s*(?P<ptr>\*?)\s*(?P<name>\w+)\s*(?:\[(?P<dim>[^\]]+)\])?$")


def header_struct(ggml_h_text: str, name: str = "ggml_tensor") -> list[tuple[str, Any]]:
    """The fields of `struct <name>` as ggml.h declares them, as a ctypes `_fields_` list.

    Pointers become c_void_p, enums c_int, fixed-width integers their ctypes
    type; array sizes are evaluated with the header's #defines and sizeof of
    the fixed-width types. Used to check `CTensor` against the header.
    """
    text = _strip_comments(ggml_h_text)
    m = re.search(r"\bstruct\s+" + re.escape(name) + r"\s*\{([^{}]*)\}\s*;", text)
    if m is None:
        raise ArgumentError(f"the header declares no struct {name}")
    defines = parse_defines(ggml_h_text)
    fields: list[tuple[str, Any]] = []
    for decl in m.group(1).split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        f = _FIELD.match(decl)
        if f is None:
            raise ArgumentError(f"struct {name}: cannot parse the field {decl!r}")
        ctype_words = f.group("type").split()
        if f.group("ptr"):
            ctype: Any = ctypes.c_void_p
        elif ctype_words[0] == "enum":
            ctype = ctypes.c_int
        elif ctype_words[-1] in _CTYPES_OF:
            ctype = _CTYPES_OF[ctype_words[-1]]
        else:
            raise ArgumentError(f"struct {name}: unknown field type {f.group('type')!r} of {f.group('name')}")
        dim = f.group("dim")
        if dim is not None:
            dim = _SIZEOF.sub(lambda s: str(ctypes.sizeof(_CTYPES_OF[s.group(1)])), dim)
            ctype = ctype * eval_c_int(dim, defines, f"struct {name}: {f.group('name')}[]")
        fields.append((f.group("name"), ctype))
    return fields


@functools.cache
def header_text(name: str = "ggml.h") -> str:
    """The text of one of ggml's public headers at the oracle's commit (extracting the sdist if needed)."""
    return (llamacpp.include_dir() / name).read_text()


@functools.cache
def c_enums() -> dict[str, dict[str, int]]:
    """`parse_enums(header_text("ggml.h"))`, parsed once."""
    return parse_enums(header_text("ggml.h"))


# --- pyggml's numbers -> C's, by name ---


# Op params words that hold an enum value: op name -> {word: (C enum, C member prefix, pyggml enum)}.
# Only these words are converted (by member name); every other word is passed to C as it is. pyggml's enums
# (ggml_unary_op, ggml_glu_op, ggml_sort_order, ...) are ggml.h's, names and values (tests/core/
# test_enums_ggml_h.py checks them), so no word needs converting: the mapping is the identity.
ENUM_OP_PARAMS: dict[str, dict[int, tuple[str, str, type[IntEnum]]]] = {}

# Ops whose op_params hold a Python callable: C cannot call it (ggml's hold a C function pointer).
PYTHON_ONLY_OPS = frozenset({"MAP_CUSTOM1", "MAP_CUSTOM2", "MAP_CUSTOM3", "CUSTOM"})

_ORACLE = f"ggml (C, llama.cpp {llamacpp.LLAMA_CPP_COMMIT})"


def _c_member(enum: str, member: str) -> int | None:
    return c_enums()[enum].get(member)


def c_type(t: GGMLType, tensor: Tensor | None = None) -> int:
    """C's number of pyggml's type `t` (GGML_TYPE_<name>), or UnsupportedTypeError."""
    value = _c_member("ggml_type", f"GGML_TYPE_{t.name}")
    if value is None:
        of = f" of '{tensor.name}'" if tensor is not None else ""
        raise UnsupportedTypeError(f"{_ORACLE} has no type GGML_TYPE_{t.name}: pyggml's type {t.name}{of} cannot "
                                   f"be checked against it")
    return value


def c_op(op: GGMLOp, tensor: Tensor | None = None) -> int:
    """C's number of pyggml's op `op` (GGML_OP_<name>), or UnsupportedOpError (also for ops that carry a
    Python callable, `PYTHON_ONLY_OPS`)."""
    of = f" of '{tensor.name}'" if tensor is not None else ""
    if op.name in PYTHON_ONLY_OPS:
        raise UnsupportedOpError(f"op {op.name}{of} calls a Python function: {_ORACLE} cannot run it")
    value = _c_member("ggml_op", f"GGML_OP_{op.name}")
    if value is None:
        raise UnsupportedOpError(f"{_ORACLE} has no op GGML_OP_{op.name}: pyggml's op {op.name}{of} cannot be "
                                 f"checked against it")
    return value


def c_op_params(t: Tensor) -> list[int]:
    """The 16 op_params words of `t` for C: pyggml's words, with those `ENUM_OP_PARAMS` lists (none today: pyggml's
    enums are ggml.h's) translated by member name. UnsupportedOpError if such a word has no C counterpart."""
    words = [int(w) for w in t.op_params]
    for i, (enum, prefix, py_enum) in ENUM_OP_PARAMS.get(t.op.name, {}).items():
        try:
            member = py_enum(words[i])
        except ValueError:
            raise UnsupportedOpError(f"op {t.op.name} of '{t.name}': op param {i} = {words[i]} is no "
                                     f"{py_enum.__name__}") from None
        value = _c_member(enum, prefix + member.name)
        if value is None:
            raise UnsupportedOpError(f"{_ORACLE} has no {prefix}{member.name}: pyggml's {t.op.name} "
                                     f"{member.name} of '{t.name}' cannot be checked against it")
        words[i] = value
    return words


def c_flags(t: Tensor) -> int:
    """C's flags word for pyggml's flags of `t` (GGML_TENSOR_FLAG_<name> for each flag set)."""
    out = 0
    for flag in TensorFlag:
        if flag.name is not None and t.flags & flag:
            value = _c_member("ggml_tensor_flag", f"GGML_TENSOR_FLAG_{flag.name}")
            if value is None:
                raise ArgumentError(f"{_ORACLE} has no GGML_TENSOR_FLAG_{flag.name} (flag of '{t.name}')")
            out |= value
    return out


# --- the library ---


class CTensor(ctypes.Structure):
    """`struct ggml_tensor` of ggml.h at 0c1e570 (checked against the header and the library by `load`)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


class CObject(ctypes.Structure):
    """`struct ggml_object` of ggml.c (not in a header): what ggml_tensor_overhead() adds to a tensor."""

    _fields_ = [("offs", ctypes.c_size_t), ("size", ctypes.c_size_t), ("next", ctypes.c_void_p),
                ("type", ctypes.c_int), ("padding", ctypes.c_char * 4)]


class CInitParams(ctypes.Structure):
    """`struct ggml_init_params`."""

    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


_P = ctypes.c_void_p
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    # ggml-base (ggml.h, ggml-backend.h)
    "ggml_init": (_P, [CInitParams]),
    "ggml_free": (None, [_P]),
    "ggml_tensor_overhead": (ctypes.c_size_t, []),
    "ggml_graph_overhead_custom": (ctypes.c_size_t, [ctypes.c_size_t, ctypes.c_bool]),
    "ggml_new_tensor": (_P, [_P, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]),
    "ggml_view_1d": (_P, [_P, _P, ctypes.c_int64, ctypes.c_size_t]),
    "ggml_set_name": (_P, [_P, ctypes.c_char_p]),
    "ggml_get_name": (ctypes.c_char_p, [_P]),
    "ggml_get_data": (_P, [_P]),
    "ggml_set_output": (None, [_P]),
    "ggml_nbytes": (ctypes.c_size_t, [_P]),
    "ggml_nelements": (ctypes.c_int64, [_P]),
    "ggml_new_graph_custom": (_P, [_P, ctypes.c_size_t, ctypes.c_bool]),
    "ggml_graph_add_node": (None, [_P, _P]),
    "ggml_build_forward_expand": (None, [_P, _P]),
    "ggml_op_name": (ctypes.c_char_p, [ctypes.c_int]),
    "ggml_type_name": (ctypes.c_char_p, [ctypes.c_int]),
    "ggml_unary_op_name": (ctypes.c_char_p, [ctypes.c_int]),
    "ggml_status_to_string": (ctypes.c_char_p, [ctypes.c_int]),
    "ggml_backend_free": (None, [_P]),
    "ggml_backend_graph_compute": (ctypes.c_int, [_P, _P]),
    "ggml_backend_supports_op": (ctypes.c_bool, [_P, _P]),
    "ggml_new_tensor_2d": (_P, [_P, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]),
    "ggml_mul_mat": (_P, [_P, _P, _P]),
    "ggml_mul_mat_id": (_P, [_P, _P, _P, _P]),
    "ggml_new_tensor_3d": (_P, [_P, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]),
    "ggml_new_graph": (_P, [_P]),
    "ggml_backend_reg_dev_get": (_P, [_P, ctypes.c_size_t]),
    "ggml_backend_reg_get_proc_address": (_P, [_P, ctypes.c_char_p]),
    "ggml_backend_buft_name": (ctypes.c_char_p, [_P]),
    "ggml_backend_cpu_buffer_type": (_P, []),
    "ggml_backend_alloc_ctx_tensors_from_buft": (_P, [_P, _P]),
    "ggml_backend_buffer_free": (None, [_P]),
    "ggml_backend_tensor_set": (None, [_P, _P, ctypes.c_size_t, ctypes.c_size_t]),
    "ggml_backend_tensor_get": (None, [_P, _P, ctypes.c_size_t, ctypes.c_size_t]),
    # ggml-cpu (ggml-cpu.h)
    "ggml_cpu_init": (None, []),
    "ggml_backend_cpu_init": (_P, []),
    "ggml_backend_cpu_set_n_threads": (None, [_P, ctypes.c_int]),
    "ggml_backend_cpu_reg": (_P, []),
    "ggml_cpu_has_avx512": (ctypes.c_int, []),
    "ggml_cpu_has_avx512_bf16": (ctypes.c_int, []),
}


class GGMLLib:
    """libggml-base and libggml-cpu with the signatures pyggml calls; one per process (`load`)."""

    def __init__(self, paths: Mapping[str, Path]) -> None:
        self.paths = dict(paths)
        # base first and global: libggml-cpu resolves ggml_* from it
        self.base = ctypes.CDLL(str(paths["ggml-base"]), mode=ctypes.RTLD_GLOBAL)
        self.cpu = ctypes.CDLL(str(paths["ggml-cpu"]), mode=ctypes.RTLD_GLOBAL)
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(self.cpu if hasattr(self.cpu, name) else self.base, name)
            fn.restype, fn.argtypes = restype, argtypes
            setattr(self, name, fn)
        self.ggml_cpu_init()  # once here, so forked children inherit its tables instead of rebuilding them
        self._supports_backend: int | None = None

    # typed access to the functions set above (ctypes functions are untyped attributes)
    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"GGMLLib has no function {name!r} (add it to _SIGNATURES)")

    def tensor(self, ptr: int) -> CTensor:
        return CTensor.from_address(ptr)

    def check_layout(self) -> None:
        """Raise GGMLCError unless CTensor is the header's struct ggml_tensor and the library agrees."""
        header = type("HeaderTensor", (ctypes.Structure,), {"_fields_": header_struct(header_text("ggml.h"))})
        ours = [(name, getattr(CTensor, name).offset, getattr(CTensor, name).size) for name, _ in CTensor._fields_]
        theirs = [(name, getattr(header, name).offset, getattr(header, name).size) for name, _ in header._fields_]
        if ours != theirs or ctypes.sizeof(CTensor) != ctypes.sizeof(header):
            raise GGMLCError(f"CTensor does not match ggml.h's struct ggml_tensor:\n  ours   {ours}\n  header {theirs}")
        defines = parse_defines(header_text("ggml.h"))
        for name, ours_value in (("GGML_MAX_DIMS", GGML_MAX_DIMS), ("GGML_MAX_SRC", GGML_MAX_SRC),
                                 ("GGML_MAX_NAME", GGML_MAX_NAME), ("GGML_MAX_OP_PARAMS", GGML_MAX_OP_PARAMS)):
            if defines.get(name) != ours_value:
                raise GGMLCError(f"ggml.h has {name} = {defines.get(name)}, pyggml {ours_value}")
        size = self.ggml_tensor_overhead() - ctypes.sizeof(CObject)
        if ctypes.sizeof(CTensor) != size:
            raise GGMLCError(f"sizeof(CTensor) = {ctypes.sizeof(CTensor)} but the library's tensors take {size} "
                             f"bytes (ggml_tensor_overhead() - sizeof(struct ggml_object))")
        # fields written by the library, read through CTensor
        ctx = self.ggml_init(CInitParams(1 << 16, None, True))
        if not ctx:
            raise GGMLCError("ggml_init failed")
        try:
            ne = (ctypes.c_int64 * 4)(6, 5, 4, 3)
            f32 = c_enums()["ggml_type"]["GGML_TYPE_F32"]
            a = self.ggml_new_tensor(ctx, f32, 4, ne)
            self.ggml_set_name(a, b"probe")
            self.ggml_set_output(a)
            v = self.ggml_view_1d(ctx, a, 7, 12)
            ta, tv = self.tensor(a), self.tensor(v)
            tv.data = 0x1000
            want = {
                "type": (ta.type, f32), "ne": (list(ta.ne), [6, 5, 4, 3]), "nb": (list(ta.nb), [4, 24, 120, 480]),
                "nbytes": (self.ggml_nbytes(a), 1440), "name": (ta.name, self.ggml_get_name(a)),
                "flags": (ta.flags, c_enums()["ggml_tensor_flag"]["GGML_TENSOR_FLAG_OUTPUT"]),
                "view op": (tv.op, c_enums()["ggml_op"]["GGML_OP_VIEW"]), "view_src": (tv.view_src, a),
                "src[0]": (tv.src[0], a), "view_offs": (tv.view_offs, 12),
                "op_params (the view's offset)": (tv.op_params[0], 12), "data": (self.ggml_get_data(v), 0x1000),
                "ne of the view": (self.ggml_nelements(v), 7),
            }
            bad = {k: v for k, v in want.items() if v[0] != v[1]}
            if bad:
                raise GGMLCError(f"CTensor reads the library's struct ggml_tensor wrong: {bad}")
        finally:
            self.ggml_free(ctx)

    def supports_backend(self) -> int:
        """A CPU backend kept for supports_op (compute makes its own, in the child when isolated)."""
        if self._supports_backend is None:
            self._supports_backend = self.ggml_backend_cpu_init()
        return self._supports_backend


@functools.cache
def x86_level() -> str:
    """The x86 level libggml-cpu is built for, by pyggml's names (numerics.X86_LEVELS)."""
    lib = load()
    if not lib.ggml_cpu_has_avx512():
        return "avx2"
    if not lib.ggml_cpu_has_avx512_bf16():
        return "avx512"
    # the library has no AVX512_FP16 query: its -march=native build has it where this host and compiler do
    return "avx512fp16" if llamacpp.compiler_defines("__AVX512FP16__") else "avx512bf16"


@functools.cache
def load() -> GGMLLib:
    """The libraries, building them if this machine lacks them (NoCompilerError if it cannot), with the
    struct layout checked."""
    lib = GGMLLib(llamacpp.require_libs(llamacpp.GGML_LIBS))
    lib.check_layout()
    return lib


# --- a pyggml graph as a C graph ---


@dataclass
class _Spec:
    """One tensor as C will see it; `src`/`view_src` are indices into the plan's specs (-1: none)."""

    tensor: Tensor
    type: int
    ne: list[int]
    nb: list[int]
    op: int
    op_params: list[int]
    flags: int
    src: list[int]
    view_src: int
    view_offs: int
    name: bytes
    root: int  # the spec whose storage holds this tensor's bytes (itself if it has no view_src)
    offset: int  # byte offset in the root's storage
    nbytes: int


@dataclass
class _Plan:
    specs: list[_Spec]
    nodes: list[int]  # what C computes, in order
    outputs: list[int]  # whose bytes come back
    storage: dict[int, np.ndarray]  # root spec index -> aligned C-side memory (inputs already copied in)

    def address(self, i: int) -> int:
        s = self.specs[i]
        return memory.address_of(self.storage[s.root]) + s.offset


def _describe(t: Tensor) -> str:
    return f"{t.op.name} {shape_str(t)}"


def _closure(nodes: Sequence[Tensor]) -> list[Tensor]:
    """Every tensor the nodes reach through src and view_src, each after the ones it refers to."""
    order: list[Tensor] = []
    seen: set[int] = set()
    for root in nodes:
        if id(root) in seen:
            continue
        seen.add(id(root))
        stack: list[tuple[Tensor, list[Tensor]]] = [(root, _refs(root))]
        while stack:
            t, todo = stack[-1]
            while todo:
                s = todo.pop(0)
                if id(s) not in seen:
                    seen.add(id(s))
                    stack.append((s, _refs(s)))
                    break
            else:
                stack.pop()
                order.append(t)
    return order


def _refs(t: Tensor) -> list[Tensor]:
    refs = [s for s in t.src if s is not None]
    if t.view_src is not None:
        refs.append(t.view_src)
    return refs


def forward_nodes(tensor: Tensor) -> list[Tensor]:
    """The nodes ggml_build_forward_expand(tensor) would list, in its order (sources in src order, then the
    tensor), without touching names or a Graph."""
    return [t for t in _closure_src_only(tensor) if t.op != GGMLOp.NONE or t.is_param]


def _closure_src_only(root: Tensor) -> list[Tensor]:
    order: list[Tensor] = []
    seen = {id(root)}
    stack: list[tuple[Tensor, int]] = [(root, 0)]
    while stack:
        t, i = stack[-1]
        while i < GGML_MAX_SRC:
            s = t.src[i]
            i += 1
            if s is not None and id(s) not in seen:
                seen.add(id(s))
                stack[-1] = (t, i)
                stack.append((s, 0))
                break
        else:
            stack.pop()
            order.append(t)
    return order


def _read_input(t: Tensor, nbytes: int, needed_by: str) -> np.ndarray:
    """The bytes [0, nbytes) of storage tensor `t` from pyggml: through its backend buffer, else host memory."""
    raw = np.empty(nbytes, dtype=np.uint8)
    if nbytes == 0:
        return raw
    if t.data is None:
        raise NotAllocatedError(f"{_ORACLE}: input '{t.name}' of {needed_by} has no memory (data is None)")
    if tensor_buffer(t) is not None:
        tensor_get(t, raw, 0, nbytes)
        return raw
    found = memory.find(t.data, nbytes)
    if found is None:
        raise OutOfBoundsError(f"{_ORACLE}: input '{t.name}' of {needed_by}: {nbytes} bytes at {t.data:#x} are in "
                               f"no buffer and no host memory")
    array, offset = found
    raw[:] = array[offset: offset + nbytes]
    return raw


def _aligned(nbytes: int) -> np.ndarray:
    """Zeroed memory of nbytes (plus slack), starting at an _ALIGN boundary."""
    base = np.zeros(nbytes + _SLACK + _ALIGN, dtype=np.uint8)
    skip = -memory.address_of(base) % _ALIGN
    return base[skip: skip + nbytes + _SLACK]


def _plan(nodes: Sequence[Tensor], outputs: Sequence[Tensor], what: str, inputs: str = "read") -> _Plan:
    """Map every tensor to C's numbers (GGMLError subclasses naming the tensor if one cannot be) and give
    each storage tensor C-side memory, inputs copied in from pyggml (`inputs` "read"), left zeroed ("zero"),
    or no memory at all ("none": for supports_op, which looks at types, shapes and op_params only)."""
    tensors = _closure(nodes)
    index = {id(t): i for i, t in enumerate(tensors)}
    computed = {id(t) for t in nodes if t.op != GGMLOp.NONE}
    specs: list[_Spec] = []
    for t in tensors:
        traits = TYPE_TRAITS[t.type]
        if traits.is_quantized and t.ne[0] % traits.blck_size:
            raise ArgumentError(f"{what}: '{t.name}' has ne[0] = {t.ne[0]}, not a whole number of {traits.name} "
                                f"blocks of {traits.blck_size}")
        view_src = index[id(t.view_src)] if t.view_src is not None else -1
        if view_src >= 0:
            root, offset = specs[view_src].root, specs[view_src].offset + t.view_offs
        else:
            root, offset = len(specs), 0
        nbytes = t.nbytes()
        if view_src >= 0:
            root_bytes = specs[root].nbytes
            if t.view_offs < 0 or offset + nbytes > root_bytes:
                raise OutOfBoundsError(f"{what}: view '{t.name}' ({nbytes} bytes at offset {offset}) is outside "
                                       f"'{specs[root].tensor.name}' ({root_bytes} bytes)")
        specs.append(_Spec(
            tensor=t, type=c_type(t.type, t), ne=list(t.ne), nb=list(t.nb), op=c_op(t.op, t), op_params=c_op_params(t),
            flags=c_flags(t), src=[index[id(s)] if s is not None else -1 for s in t.src], view_src=view_src,
            view_offs=t.view_offs, name=t.name.encode("utf-8", "replace")[: GGML_MAX_NAME - 1], root=root,
            offset=offset, nbytes=nbytes))
    storage: dict[int, np.ndarray] = {}
    for i, s in enumerate(specs):
        if s.root != i or inputs == "none":
            continue
        storage[i] = _aligned(s.nbytes)
        if inputs == "read" and id(s.tensor) not in computed:  # an input: C starts from pyggml's bytes
            storage[i][: s.nbytes] = _read_input(s.tensor, s.nbytes, what)
    return _Plan(specs, [index[id(t)] for t in nodes], [index[id(t)] for t in outputs], storage)


def _build(lib: GGMLLib, plan: _Plan, ctx: int) -> list[int]:
    """The plan's tensors in context `ctx`, fields filled as ggml-rpc's deserialize_tensor fills them."""
    ptrs: list[int] = []
    compute = c_enums()["ggml_tensor_flag"]["GGML_TENSOR_FLAG_COMPUTE"]
    nodes = set(plan.nodes)
    for i, s in enumerate(plan.specs):
        ptr = lib.ggml_new_tensor(ctx, s.type, GGML_MAX_DIMS, (ctypes.c_int64 * GGML_MAX_DIMS)(*s.ne))
        if not ptr:
            raise GGMLCError(f"ggml_new_tensor failed for '{s.tensor.name}'")
        ct = lib.tensor(ptr)
        ct.nb[:] = s.nb
        ct.op = s.op
        ct.op_params[:] = s.op_params
        # ggml_build_forward_expand marks what it lists as COMPUTE; the CPU backend skips nodes without it
        ct.flags = s.flags | (compute if i in nodes and s.tensor.op != GGMLOp.NONE else 0)
        ct.src[:] = [ptrs[j] if j >= 0 else None for j in s.src]
        ct.view_src = ptrs[s.view_src] if s.view_src >= 0 else None
        ct.view_offs = s.view_offs
        ct.data = plan.address(i) if plan.storage else None
        lib.ggml_set_name(ptr, s.name)
        ptrs.append(ptr)
    return ptrs


def _compute(lib: GGMLLib, plan: _Plan, threads: int, out: Any) -> None:
    """Build and compute the plan in C, then copy each output's bytes into `out` (one after another)."""
    n = len(plan.specs)
    mem = lib.ggml_tensor_overhead() * (n + 1) + lib.ggml_graph_overhead_custom(max(len(plan.nodes), 1), False)
    ctx = lib.ggml_init(CInitParams(mem + 4096, None, True))
    if not ctx:
        raise GGMLCError(f"ggml_init of {mem} bytes failed")
    try:
        ptrs = _build(lib, plan, ctx)
        graph = lib.ggml_new_graph_custom(ctx, max(len(plan.nodes), 1), False)
        for i in plan.nodes:  # exactly pyggml's nodes in pyggml's order, as the RPC server takes them
            lib.ggml_graph_add_node(graph, ptrs[i])
        backend = lib.ggml_backend_cpu_init()
        try:
            lib.ggml_backend_cpu_set_n_threads(backend, threads)
            status = lib.ggml_backend_graph_compute(backend, graph)
        finally:
            lib.ggml_backend_free(backend)
        if status != 0:
            raise GGMLCError(f"ggml_backend_graph_compute returned {status} "
                             f"({(lib.ggml_status_to_string(status) or b'?').decode()})")
        dst = np.frombuffer(out, dtype=np.uint8)
        pos = 0
        for i in plan.outputs:
            spec = plan.specs[i]
            dst[pos: pos + spec.nbytes] = plan.storage[spec.root][spec.offset: spec.offset + spec.nbytes]
            pos += spec.nbytes
    finally:
        lib.ggml_free(ctx)


def _run_forked(fn: Callable[[mmap.mmap], None], out_size: int, timeout: float, what: str) -> bytes:
    """Run `fn(shared)` in a forked child and return the `out_size` bytes it wrote to `shared`.

    The child's stderr goes to a file that becomes the message of the GGMLCError raised when the child is
    killed by a signal (GGML_ASSERT aborts), exits non-zero, or outlives `timeout` seconds (then it is
    killed). GGML_NO_BACKTRACE keeps ggml from attaching a debugger to print a backtrace.
    """
    with mmap.mmap(-1, max(out_size, 1)) as shared, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: C calls and raw writes only, then _exit without Python's cleanup
            code = 0
            try:
                os.dup2(err.fileno(), 2)
                faulthandler.disable()  # pytest's would print a Python traceback of ggml's abort to the terminal
                os.environ["GGML_NO_BACKTRACE"] = "1"
                fn(shared)
            except GGMLCError as e:
                os.write(2, str(e).encode())
                code = 4
            except BaseException:
                os.write(2, traceback.format_exc().encode())
                code = 3
            finally:
                os._exit(code)
        try:
            status = _wait(pid, timeout)
        except BaseException:  # Ctrl-C while waiting: leave no child computing behind
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise
        err.seek(0)
        message = err.read().decode(errors="replace").strip()
        if status is None:
            raise GGMLCError(f"{what}: ggml did not finish in {timeout:g} s (killed){_tail(message)}")
        code = os.waitstatus_to_exitcode(status)
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            raise GGMLCError(f"{what}: ggml was killed by {name}{_tail(message)}")
        if code != 0:
            raise GGMLCError(f"{what}: ggml failed (exit {code}){_tail(message)}")
        return shared[:out_size]


def _tail(message: str, n: int = 1500) -> str:
    return f":\n{message[-n:]}" if message else " (no message)"


def _wait(pid: int, timeout: float) -> int | None:
    """waitpid with a timeout: the status, or None after killing the child."""
    deadline = time.monotonic() + timeout
    delay = 0.0002
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def compute_nodes(nodes: Sequence[Tensor], outputs: Sequence[Tensor], threads: int = 1, *, isolate: bool = True,
                  timeout: float = DEFAULT_TIMEOUT) -> list[np.ndarray]:
    """Compute `nodes` (pyggml tensors, in this order) in C; return the raw bytes [0, nbytes) of each of
    `outputs` (uint8 arrays, laid out with the tensor's nb).

    Tensors the nodes refer to but that are not among them are inputs: their
    bytes are read from pyggml (buffer or host memory). `isolate` runs C in a
    forked child (see the module doc); without it an assert in C ends this
    process. `threads` > 1 runs ggml's OpenMP threads, and only in this
    process (`isolate=False`): libgomp's thread pool does not survive a fork,
    and any library of this process may have started it (numba's "omp"
    threading layer does), so a forked child that runs OpenMP threads can hang.
    """
    threads = check_int(threads, f"{_ORACLE}: threads", minimum=1, maximum=GGML_MAX_N_THREADS)
    if isolate and threads > 1:
        raise ArgumentError(f"{_ORACLE}: threads={threads} needs isolate=False (OpenMP threads in a forked child "
                            f"can hang when this process has started an OpenMP pool)")
    what = f"{_ORACLE} computing {len(nodes)} node(s) ending in {_describe(nodes[-1])}" if nodes else _ORACLE
    lib = load()
    plan = _plan(nodes, outputs, what)
    sizes = [plan.specs[i].nbytes for i in plan.outputs]
    total = sum(sizes)
    if isolate:
        raw = np.frombuffer(_run_forked(lambda shared: _compute(lib, plan, threads, shared), total, timeout, what),
                            dtype=np.uint8)
    else:
        raw = np.zeros(max(total, 1), dtype=np.uint8)
        _compute(lib, plan, threads, raw)
    bounds = np.cumsum([0, *sizes])
    return [raw[bounds[k]: bounds[k + 1]].copy() for k in range(len(sizes))]


def node_values(t: Tensor, raw: np.ndarray) -> np.ndarray:
    """The elements of `t` from its raw bytes, as tensor_get_numpy gives them (contiguous, numpy_shape)."""
    tr = TYPE_TRAITS[t.type]
    ne, nb = t.ne, t.nb
    if tr.blck_size > 1 or tr.np_dtype is None:
        dtype, shape, strides = np.dtype(np.uint8), (ne[3], ne[2], ne[1], ne[0] // tr.blck_size * tr.type_size), \
            (nb[3], nb[2], nb[1], 1)
    else:
        dtype, shape, strides = tr.np_dtype, (ne[3], ne[2], ne[1], ne[0]), (nb[3], nb[2], nb[1], nb[0])
    if raw.size == 0 or math.prod(shape) == 0:
        return np.zeros(numpy_shape(t), dtype=dtype)
    elements = np.ndarray(shape, dtype=dtype, buffer=raw, strides=strides)
    return np.ascontiguousarray(elements).reshape(numpy_shape(t))


def compute_like(node: Tensor, threads: int = 1, *, isolate: bool = True,
                 timeout: float = DEFAULT_TIMEOUT) -> np.ndarray:
    """The oracle: `node`'s value computed by C from the graph that ends in it.

    The graph is what ggml_build_forward_expand(node) lists (sources in src
    order), rebuilt in C field by field; its leafs (and any other tensor it
    reads but does not compute) must have data in pyggml memory, which is
    copied, never written. Ops and types are mapped to C's numbers by name;
    op_params go as they are (pyggml lays them out as ggml does; the words
    `ENUM_OP_PARAMS` lists would be translated by name). A pyggml op or type
    that C lacks raises UnsupportedOpError/UnsupportedTypeError naming it;
    a failure inside C raises GGMLCError.

    Returns what `tensor_get_numpy(node)` returns for pyggml's result: the
    type's numpy dtype (BF16 as uint16 bits, quantized as raw blocks),
    contiguous, shape `numpy_shape(node)`; `op_check.to_f64` makes float64.

    A graph that writes into its inputs (in-place ops, CPY into a leaf) reads
    them from pyggml's memory: call this before pyggml computes such a graph.
    """
    nodes = forward_nodes(node)
    if not nodes:
        raise ArgumentError(f"compute_like: '{node.name}' is a leaf (op NONE): there is nothing to compute")
    (raw,) = compute_nodes(nodes, [node], threads, isolate=isolate, timeout=timeout)
    return node_values(node, raw)


# --- a pyggml backend computing in C ---


class GGMLCBackend(CPUBackend):
    """A pyggml backend named "ggml-c": pyggml's CPU host buffers, graphs computed by real ggml.

    Each `graph_compute` rebuilds the graph's nodes in C (`compute_nodes`), computes them with ggml's
    CPU backend on `n_threads` threads (1 by default: deterministic), and writes every computed node's
    bytes back into its pyggml buffer. `supports_op` is true when the op, its types (and unary op) have
    C counterparts and ggml's CPU backend says it supports the node. The reference of
    `op_check.run_case` for `pyggml test-ops --against ggml`.

    ggml's CPU supports_op says yes to many nodes its kernels then refuse with GGML_ABORT (F16 for
    SCALE, NORM, SOFT_MAX, ...) or GGML_ASSERT (non-contiguous sources). With `probe=True`,
    supports_op also computes the node once, alone, on zeroed inputs in a forked child, and a node C
    aborts on is "not supported" (the reason is logged and kept in `probed`); without it such a node
    fails in graph_compute with ggml's message. Kernels whose checks are plain `assert`s (compiled out
    in a release build) are not caught either way: they compute garbage from layouts they do not take.
    """

    def __init__(self, n_threads: int | None = 1, *, isolate: bool = True, probe: bool = False,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__(n_threads)
        if isolate and self.n_threads != 1:
            raise ArgumentError(f"{_ORACLE}: n_threads={self.n_threads} needs isolate=False (see compute_nodes)")
        self.isolate = isolate
        self.probe = probe
        self.probed: dict[tuple[Any, ...], str] = {}  # node layout -> ggml's abort message ("" if none)
        self.timeout = timeout
        self.lib = load()  # fail here, not at the first compute, if the libraries cannot be had

    def _get_name(self) -> str:
        return "ggml-c"

    def _graph_plan_create(self, graph: Graph) -> Graph:
        return graph

    def _graph_plan_free(self, plan: Graph) -> None:
        pass

    def _graph_plan_compute(self, plan: Graph) -> None:
        self._graph_compute(plan)

    def _graph_compute(self, graph: Graph) -> None:
        nodes = list(graph.nodes)
        if not nodes:
            return
        written = [t for t in nodes if t.op != GGMLOp.NONE and not is_view_op(t.op)]
        results = compute_nodes(nodes, written, self.n_threads, isolate=self.isolate, timeout=self.timeout)
        for t, raw in zip(written, results, strict=True):  # in node order: a later write wins, as in C
            if raw.size:
                tensor_set(t, raw, 0, raw.size)

    def _supports_op(self, op: Tensor) -> bool:
        try:
            plan = _plan([op], [], f"supports_op of {_describe(op)}", inputs="none")
        except (UnsupportedOpError, UnsupportedTypeError, OutOfBoundsError, ArgumentError):
            return False
        if not _c_supports(self.lib, plan):
            return False
        return not self.probe or self._probe(op, plan)

    def _probe(self, op: Tensor, plan: _Plan) -> bool:
        """Whether C computes node `op` alone on zeroed inputs without aborting (cached by the node's layout)."""
        key = tuple((s.type, *s.ne, *s.nb, s.op, *s.op_params, *s.src, s.view_src, s.view_offs) for s in plan.specs)
        if key not in self.probed:
            try:
                zeroed = _plan([op], [], f"probe of {_describe(op)}", inputs="zero")
                _run_forked(lambda shared: _compute(self.lib, zeroed, 1, shared), 0, self.timeout,
                            f"probe of {_describe(op)}")
                self.probed[key] = ""
            except GGMLCError as e:
                log.info("ggml-c: %s", e)
                self.probed[key] = str(e)
        return not self.probed[key]


def _c_supports(lib: GGMLLib, plan: _Plan) -> bool:
    """ggml_backend_supports_op of ggml's CPU backend for the plan's last node (a plan without memory: C
    only looks at types, shapes and op_params)."""
    n = len(plan.specs)
    ctx = lib.ggml_init(CInitParams(lib.ggml_tensor_overhead() * (n + 1) + 4096, None, True))
    if not ctx:
        raise GGMLCError("ggml_init failed")
    try:
        ptrs = _build(lib, plan, ctx)
        return bool(lib.ggml_backend_supports_op(lib.supports_backend(), ptrs[plan.nodes[-1]]))
    finally:
        lib.ggml_free(ctx)


def ggml_c_init(n_threads: int = 1, **kwargs: Any) -> GGMLCBackend:
    """A "ggml-c" backend (see GGMLCBackend); NoCompilerError if libggml cannot be built on this machine."""
    return GGMLCBackend(n_threads, **kwargs)


# --- MUL_MAT of a weight held in the CPU's extra buffer type (CPU_REPACK: ggml-cpu/repack.cpp) ---


def extra_bufts(lib: GGMLLib) -> dict[str, int]:
    """The CPU device's extra buffer types by name (ggml_backend_dev_get_extra_bufts, as llama.cpp's loader asks)."""
    reg = lib.ggml_backend_cpu_reg()
    fn = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
    if not fn:
        raise GGMLCError("the CPU registry has no ggml_backend_dev_get_extra_bufts")
    get = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(fn)
    listed = get(lib.ggml_backend_reg_dev_get(reg, 0))
    out: dict[str, int] = {}
    i = 0
    while listed[i]:
        out[(lib.ggml_backend_buft_name(listed[i]) or b"?").decode()] = listed[i]
        i += 1
    return out


class MulMatInBuft:
    """In C: a weight matrix in a buffer of `buft` (written by ggml_backend_tensor_set, which repacks it), x and
    their MUL_MAT in a CPU buffer and a CPU backend on `threads` threads, kept for `compute` to run again (a
    benchmark's peer); `free` releases them. Threads > 1 only outside a forked child (see compute_nodes).
    With `ids` (int32 (N, n_used)): `raw` is a stack of experts (n_as, M, row bytes), x (N, ne11, K) and the op
    their MUL_MAT_ID, each token's n_used slots through the experts `ids` names (result (N, n_used, M))."""

    def __init__(self, lib: GGMLLib, buft: int, type_id: int, raw: np.ndarray, x: np.ndarray,
                 threads: int = 1, ids: np.ndarray | None = None) -> None:
        M, K = raw.shape[-2], x.shape[-1]
        n_rows = x.shape[0] if ids is None else ids.size
        self.lib, self.nbytes = lib, 4 * M * n_rows
        f32 = c_enums()["ggml_type"]["GGML_TYPE_F32"]
        self.ctx_w = lib.ggml_init(CInitParams(lib.ggml_tensor_overhead() * 2 + 1024, None, True))
        self.ctx_x = lib.ggml_init(CInitParams(lib.ggml_tensor_overhead() * 5
                                               + lib.ggml_graph_overhead_custom(2048, False) + 1024, None, True))
        if not self.ctx_w or not self.ctx_x:
            raise GGMLCError("ggml_init failed")
        if ids is None:
            self.w = lib.ggml_new_tensor_2d(self.ctx_w, type_id, K, M)
            xt = lib.ggml_new_tensor_2d(self.ctx_x, f32, K, x.shape[0])
            self.prod = lib.ggml_mul_mat(self.ctx_x, self.w, xt)
        else:
            self.w = lib.ggml_new_tensor_3d(self.ctx_w, type_id, K, M, raw.shape[0])
            xt = lib.ggml_new_tensor_3d(self.ctx_x, f32, K, x.shape[1], x.shape[0])
            it = lib.ggml_new_tensor_2d(self.ctx_x, c_enums()["ggml_type"]["GGML_TYPE_I32"], ids.shape[1],
                                        ids.shape[0])
            self.prod = lib.ggml_mul_mat_id(self.ctx_x, self.w, xt, it)
        self.buf_w = lib.ggml_backend_alloc_ctx_tensors_from_buft(self.ctx_w, buft)
        self.graph = lib.ggml_new_graph(self.ctx_x)
        lib.ggml_build_forward_expand(self.graph, self.prod)
        self.buf_x = lib.ggml_backend_alloc_ctx_tensors_from_buft(self.ctx_x, lib.ggml_backend_cpu_buffer_type())
        if not self.buf_w or not self.buf_x:
            raise GGMLCError("ggml_backend_alloc_ctx_tensors_from_buft failed")
        lib.ggml_backend_tensor_set(self.w, raw.ctypes.data, 0, raw.nbytes)
        lib.ggml_backend_tensor_set(xt, x.ctypes.data, 0, x.nbytes)
        if ids is not None:
            lib.ggml_backend_tensor_set(it, ids.ctypes.data, 0, ids.nbytes)
        self.held = lib.tensor(self.w).extra is not None  # ggml's init_tensor set its tensor_traits
        self.backend = lib.ggml_backend_cpu_init()
        lib.ggml_backend_cpu_set_n_threads(self.backend, threads)

    def compute(self) -> None:
        status = self.lib.ggml_backend_graph_compute(self.backend, self.graph)
        if status != 0:
            raise GGMLCError(f"ggml_backend_graph_compute returned {status}")

    def result(self, out: np.ndarray) -> None:
        """The product's floats into `out` (a C-contiguous float32 array of M * N)."""
        self.lib.ggml_backend_tensor_get(self.prod, out.ctypes.data, 0, self.nbytes)

    def free(self) -> None:
        self.lib.ggml_backend_free(self.backend)
        for buffer in (self.buf_w, self.buf_x):
            self.lib.ggml_backend_buffer_free(buffer)
        self.lib.ggml_free(self.ctx_w)
        self.lib.ggml_free(self.ctx_x)


def _mul_mat_in_buft(lib: GGMLLib, buft: int, type_id: int, raw: np.ndarray, x: np.ndarray, out: Any,
                     ids: np.ndarray | None = None) -> None:
    """MulMatInBuft computed once on one thread: int32 `held`, then the product's floats, into `out`."""
    product = MulMatInBuft(lib, buft, type_id, raw, x, ids=ids)
    try:
        product.compute()
        dst = np.frombuffer(out, dtype=np.uint8)
        dst[:4] = np.frombuffer(np.int32(product.held).tobytes(), np.uint8)
        product.result(dst[4:].view(np.float32))
    finally:
        product.free()


def mul_mat_repacked(type: GGMLType, raw: np.ndarray, x: np.ndarray, buft_name: str = "CPU_REPACK",
                     timeout: float = DEFAULT_TIMEOUT) -> tuple[np.ndarray, bool]:
    """libggml's MUL_MAT of the weight rows `raw` (uint8 (M, row bytes) of `type`) held in the CPU's extra buffer
    type `buft_name`, times the F32 rows `x` (N, K), as llama.cpp's default run computes a layer's matrix: the
    (N, M) float32 product and whether ggml held the weight repacked (its init_tensor set `extra`). In a forked
    child, on one thread."""
    tr = TYPE_TRAITS[type]
    if raw.dtype != np.uint8 or raw.ndim != 2 or x.dtype != np.float32 or x.ndim != 2:
        raise ArgumentError(f"mul_mat_repacked: weights must be 2-D uint8 and x 2-D float32, got {raw.dtype} "
                            f"{raw.shape} and {x.dtype} {x.shape}")
    K = x.shape[1]
    if K % tr.blck_size or raw.shape[1] != K // tr.blck_size * tr.type_size:
        raise ArgumentError(f"mul_mat_repacked: rows of {raw.shape[1]} bytes are not {K} {type.name} values")
    lib = load()
    bufts = extra_bufts(lib)
    if buft_name not in bufts:
        raise UnsupportedOpError(f"mul_mat_repacked: the CPU has no extra buffer type {buft_name!r} "
                                 f"(it lists {sorted(bufts)})")
    raw, x = np.ascontiguousarray(raw), np.ascontiguousarray(x)
    M, N = raw.shape[0], x.shape[0]
    got = _run_forked(lambda shared: _mul_mat_in_buft(lib, bufts[buft_name], c_type(type), raw, x, shared),
                      4 + 4 * M * N, timeout, f"{_ORACLE}: MUL_MAT of {type.name} [{K}, {M}] in {buft_name}")
    held = bool(np.frombuffer(got[:4], np.int32)[0])
    return np.frombuffer(got[4:], np.float32).reshape(N, M).copy(), held


def mul_mat_id_in_buft(type: GGMLType, raw: np.ndarray, x: np.ndarray, ids: np.ndarray,
                       buft_name: str = "CPU_REPACK", timeout: float = DEFAULT_TIMEOUT) -> tuple[np.ndarray, bool]:
    """libggml's MUL_MAT_ID of the experts `raw` (uint8 (n_as, M, row bytes) of `type`) held in the CPU's buffer
    type `buft_name` (an extra one, or "CPU" for plain host memory), times the F32 rows `x` (N, ne11, K) routed by
    `ids` (int32 (N, n_used)): the (N, n_used, M) float32 product and whether ggml held the experts repacked. In a
    forked child, on one thread."""
    tr = TYPE_TRAITS[type]
    if raw.dtype != np.uint8 or raw.ndim != 3 or x.dtype != np.float32 or x.ndim != 3 or ids.dtype != np.int32 \
            or ids.ndim != 2 or ids.shape[0] != x.shape[0]:
        raise ArgumentError(f"mul_mat_id_in_buft: experts must be 3-D uint8, x 3-D float32 and ids 2-D int32 of "
                            f"x's tokens, got {raw.dtype} {raw.shape}, {x.dtype} {x.shape} and {ids.dtype} "
                            f"{ids.shape}")
    K = x.shape[2]
    if K % tr.blck_size or raw.shape[2] != K // tr.blck_size * tr.type_size:
        raise ArgumentError(f"mul_mat_id_in_buft: rows of {raw.shape[2]} bytes are not {K} {type.name} values")
    lib = load()
    bufts = {**extra_bufts(lib), "CPU": lib.ggml_backend_cpu_buffer_type()}
    if buft_name not in bufts:
        raise UnsupportedOpError(f"mul_mat_id_in_buft: the CPU has no buffer type {buft_name!r} "
                                 f"(it lists {sorted(bufts)})")
    raw, x, ids = np.ascontiguousarray(raw), np.ascontiguousarray(x), np.ascontiguousarray(ids)
    M, n = raw.shape[1], ids.size
    got = _run_forked(lambda shared: _mul_mat_in_buft(lib, bufts[buft_name], c_type(type), raw, x, shared, ids),
                      4 + 4 * M * n, timeout, f"{_ORACLE}: MUL_MAT_ID of {type.name} {list(raw.shape)} in {buft_name}")
    held = bool(np.frombuffer(got[:4], np.int32)[0])
    return np.frombuffer(got[4:], np.float32).reshape(*ids.shape, M).copy(), held


# --- type traits and row conversions of the C library (the oracle of pyggml.core.types and quants) ---


class CTypeTraits(ctypes.Structure):
    """`struct ggml_type_traits` of ggml.h (ggml_get_type_traits)."""

    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p), ("from_float_ref", ctypes.c_void_p)]


class CTypeTraitsCPU(ctypes.Structure):
    """`struct ggml_type_traits_cpu` of ggml-cpu.h (ggml_get_type_traits_cpu)."""

    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p), ("vec_dot_type", ctypes.c_int),
                ("nrows", ctypes.c_int64)]


# ggml_to_float_t and ggml_from_float_t: (const void * x, void * y, int64_t k)
_ROW_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_F32P = ctypes.POINTER(ctypes.c_float)
_TRAITS_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "ggml_get_type_traits": (ctypes.POINTER(CTypeTraits), [ctypes.c_int]),
    "ggml_get_type_traits_cpu": (ctypes.POINTER(CTypeTraitsCPU), [ctypes.c_int]),
    "ggml_blck_size": (ctypes.c_int64, [ctypes.c_int]),
    "ggml_type_size": (ctypes.c_size_t, [ctypes.c_int]),
    "ggml_is_quantized": (ctypes.c_bool, [ctypes.c_int]),
    "ggml_quantize_requires_imatrix": (ctypes.c_bool, [ctypes.c_int]),
    "ggml_quantize_chunk": (ctypes.c_size_t, [ctypes.c_int, _F32P, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                              ctypes.c_int64, _F32P]),
}


@functools.cache
def _traits_fn(name: str) -> Any:
    """One of `_TRAITS_SIGNATURES`' functions of the loaded libraries, typed."""
    lib = load()
    restype, argtypes = _TRAITS_SIGNATURES[name]
    fn = getattr(lib.cpu if hasattr(lib.cpu, name) else lib.base, name)
    fn.restype, fn.argtypes = restype, argtypes
    return fn


def c_type_traits(type_id: int) -> CTypeTraits:
    """ggml_get_type_traits(type_id) of the C library (any id below GGML_TYPE_COUNT, removed ones too)."""
    return _traits_fn("ggml_get_type_traits")(type_id).contents


def c_type_traits_cpu(type_id: int) -> CTypeTraitsCPU:
    """ggml_get_type_traits_cpu(type_id): the CPU backend's from_float, vec_dot and vec_dot_type."""
    return _traits_fn("ggml_get_type_traits_cpu")(type_id).contents


def c_blck_size(type_id: int) -> int:
    return int(_traits_fn("ggml_blck_size")(type_id))


def c_type_size(type_id: int) -> int:
    return int(_traits_fn("ggml_type_size")(type_id))


def _rows_f32(t: GGMLType, values: np.ndarray, what: str) -> tuple[np.ndarray, int]:
    """float32 rows (n_rows, n) of whole blocks of `t`, C-contiguous, and C's type number."""
    x = np.ascontiguousarray(values, dtype=np.float32)
    x = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    bs = TYPE_TRAITS[t].blck_size
    if x.shape[-1] % bs:
        raise ArgumentError(f"{what}: a row of {x.shape[-1]} elements is not a whole number of {t.name} blocks "
                            f"of {bs} (C would abort)")
    return x, c_type(t)


def _row_fn(address: int | None, t: GGMLType, what: str) -> Any:
    if not address:
        raise UnsupportedTypeError(f"{_ORACLE} has no {what} for {t.name}")
    return _ROW_FN(address)


def c_from_float(t: GGMLType, values: np.ndarray, *, cpu: bool = False) -> np.ndarray:
    """The C library's conversion of float32 rows to `t`, row by row: type_traits' from_float_ref
    (quantize_row_*_ref), or with `cpu` the CPU backend's own from_float (what its CPY and MUL_MAT's src1
    conversion use; SIMD code that may round differently). Returns uint8 rows of the type's bytes."""
    x, ct = _rows_f32(t, values, f"{_ORACLE} from_float")
    address = c_type_traits_cpu(ct).from_float if cpu else c_type_traits(ct).from_float_ref
    fn = _row_fn(address, t, "CPU from_float" if cpu else "from_float_ref")
    tr = TYPE_TRAITS[t]
    row_bytes = x.shape[1] // tr.blck_size * tr.type_size
    out = np.zeros((x.shape[0], row_bytes), np.uint8)
    for i in range(x.shape[0]):
        fn(x[i].ctypes.data, out[i].ctypes.data, x.shape[1])
    return out


def c_to_float(t: GGMLType, raw: np.ndarray) -> np.ndarray:
    """The C library's type_traits to_float (dequantize_row_*) of uint8 rows of `t`: float32 rows."""
    b = np.ascontiguousarray(raw, dtype=np.uint8)
    b = b.reshape(-1, b.shape[-1])
    tr = TYPE_TRAITS[t]
    if b.shape[1] % tr.type_size:
        raise ArgumentError(f"{_ORACLE} to_float: a row of {b.shape[1]} bytes is not a whole number of {t.name} "
                            f"blocks of {tr.type_size} bytes")
    fn = _row_fn(c_type_traits(c_type(t)).to_float, t, "to_float")
    n = b.shape[1] // tr.type_size * tr.blck_size
    out = np.zeros((b.shape[0], n), np.float32)
    for i in range(b.shape[0]):
        fn(b[i].ctypes.data, out[i].ctypes.data, n)
    return out


def c_quantize_chunk(t: GGMLType, values: np.ndarray, imatrix: np.ndarray | None = None) -> np.ndarray:
    """ggml_quantize_chunk(t, rows, ...) of the C library (what llama-quantize writes to files): uint8 rows.
    `imatrix`, if given, holds one float32 weight per column."""
    x, ct = _rows_f32(t, values, f"{_ORACLE} ggml_quantize_chunk")
    if imatrix is None and _traits_fn("ggml_quantize_requires_imatrix")(ct):
        raise ArgumentError(f"{_ORACLE}: ggml_quantize_chunk of {t.name} needs an importance matrix")
    qw = None
    if imatrix is not None:
        qw = np.ascontiguousarray(imatrix, dtype=np.float32).reshape(-1)
        if qw.size != x.shape[1]:
            raise ArgumentError(f"{_ORACLE}: imatrix has {qw.size} weights for rows of {x.shape[1]}")
    tr = TYPE_TRAITS[t]
    out = np.zeros((x.shape[0], x.shape[1] // tr.blck_size * tr.type_size), np.uint8)
    if out.size:
        _traits_fn("ggml_quantize_chunk")(ct, x.ctypes.data_as(_F32P), out.ctypes.data, 0, x.shape[0], x.shape[1],
                                          None if qw is None else qw.ctypes.data_as(_F32P))
    return out
