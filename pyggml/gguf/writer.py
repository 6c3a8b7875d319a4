"""Writing GGUF files: a thin layer over `gguf.GGUFWriter` for tests and tools.

`write_gguf(path, arch, metadata, tensors)` writes a whole file at once.
Every key that llama.cpp reads is written with the GGUF type llama.cpp reads
it as (`LLAMA_CPP_KEY_TYPES`: `tokenizer.ggml.token_type` an INT32 array,
`{arch}.context_length` UINT32, `{arch}.rope.freq_base` FLOAT32, ...), so
every file pyggml writes loads in llama.cpp; a value that does not fit that
type is an ArgumentError naming the key. Other keys are typed from their
Python type (bool, int, float, str, and lists of those; ints become UINT32,
or INT32/UINT64/INT64 when they do not fit). `(value, GGUFValueType)` or
`(values, GGUFValueType.ARRAY, item type)` writes a value with exactly that
type. Tensors are float arrays written as F32/F16 or quantized with pyggml's
byte-exact quantizers, or raw bytes already in a type (`RawTensor`).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGUFValueType as VT

from pyggml.core.errors import ArgumentError, GGUFError
from pyggml.core.types import TYPE_TRAITS, GGMLType, as_type, from_float
from pyggml.gguf.reader import GGUF_MAX_ALIGNMENT


@dataclass
class RawTensor:
    """Bytes already in ggml type `type`, with shape `ne` (innermost first)."""

    data: np.ndarray
    type: GGMLType
    ne: tuple[int, ...]


# The GGUF type llama.cpp reads each key as: names from llama-arch.cpp, types from the fields llama-model.cpp
# reads them into (uint32_t, float, bool), llama-vocab.cpp's checks (token_type must be an INT32 array) and
# gguf.cpp (general.alignment must be UINT32). A scalar type given for a key whose value is a list means an
# array of that type (per-layer values: `feed_forward_length`, `attention.head_count`, ...).
_GENERAL_KEY_TYPES: dict[str, VT | tuple[VT, VT]] = {
    "general.alignment": VT.UINT32,
    "general.file_type": VT.UINT32,
    "general.quantization_version": VT.UINT32,
    **{f"general.{k}": VT.STRING for k in ("type", "name", "author", "version", "url", "description", "license",
                                          "source.url", "source.huggingface.repository", "organization",
                                          "finetune", "basename", "size_label")},
}
_ARCH_KEY_TYPES: dict[str, VT | tuple[VT, VT]] = {  # "{arch}." + suffix
    **{k: VT.UINT32 for k in (
        "vocab_size", "context_length", "embedding_length", "block_count", "leading_dense_block_count",
        "feed_forward_length", "expert_feed_forward_length", "expert_shared_feed_forward_length", "expert_count",
        "expert_used_count", "expert_shared_count", "pooling_type", "decoder_start_token_id",
        "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
        "attention.group_norm_groups", "attention.q_lora_rank", "attention.kv_lora_rank",
        "attention.relative_buckets_count", "attention.sliding_window", "rope.dimension_count",
        "rope.scaling.original_context_length", "ssm.conv_kernel", "ssm.inner_size", "ssm.state_size",
        "ssm.time_step_rank", "ssm.group_count")},
    **{k: VT.FLOAT32 for k in (
        "logit_scale", "attn_logit_softcapping", "final_logit_softcapping", "residual_scale", "embedding_scale",
        "expert_weights_scale", "attention.max_alibi_bias", "attention.clamp_kqv", "attention.layer_norm_epsilon",
        "attention.layer_norm_rms_epsilon", "attention.group_norm_epsilon", "attention.scale", "rope.freq_base",
        "rope.freq_base_swa", "rope.scale_linear", "rope.scaling.factor", "rope.scaling.attn_factor",
        "rope.scaling.yarn_log_multiplier")},
    **{k: VT.BOOL for k in ("use_parallel_residual", "expert_weights_norm", "attention.causal",
                            "rope.scaling.finetuned", "ssm.dt_b_c_rms")},
    "rope.scaling.type": VT.STRING,
}
_TOKENIZER_KEY_TYPES: dict[str, VT | tuple[VT, VT]] = {
    "tokenizer.ggml.model": VT.STRING,
    "tokenizer.ggml.pre": VT.STRING,
    "tokenizer.ggml.tokens": (VT.ARRAY, VT.STRING),
    "tokenizer.ggml.token_type": (VT.ARRAY, VT.INT32),
    "tokenizer.ggml.token_type_count": VT.UINT32,
    "tokenizer.ggml.scores": (VT.ARRAY, VT.FLOAT32),
    "tokenizer.ggml.merges": (VT.ARRAY, VT.STRING),
    "tokenizer.ggml.precompiled_charsmap": (VT.ARRAY, VT.UINT8),
    "tokenizer.ggml.suppress_tokens": (VT.ARRAY, VT.INT32),
    "tokenizer.chat_template": VT.STRING,
    **{f"tokenizer.ggml.{k}_token_id": VT.UINT32 for k in (
        "bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "cls", "mask", "prefix", "suffix", "middle",
        "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep")},
    **{f"tokenizer.ggml.{k}": VT.BOOL for k in (
        "add_bos_token", "add_eos_token", "add_sep_token", "add_space_prefix", "remove_extra_whitespaces",
        "normalizer.lowercase", "normalizer.strip_accents")},
}


def llama_cpp_key_type(key: str, arch: str) -> VT | tuple[VT, VT] | None:
    """The GGUF type llama.cpp reads `key` as in a file of architecture `arch` (None: llama.cpp does not read it)."""
    if key in _GENERAL_KEY_TYPES:
        return _GENERAL_KEY_TYPES[key]
    if key in _TOKENIZER_KEY_TYPES:
        return _TOKENIZER_KEY_TYPES[key]
    if key.startswith(arch + "."):
        return _ARCH_KEY_TYPES.get(key[len(arch) + 1:])
    return None


_INT_RANGES: dict[VT, tuple[int, int]] = {
    VT.UINT8: (0, 2**8 - 1), VT.INT8: (-(2**7), 2**7 - 1), VT.UINT16: (0, 2**16 - 1),
    VT.INT16: (-(2**15), 2**15 - 1), VT.UINT32: (0, 2**32 - 1), VT.INT32: (-(2**31), 2**31 - 1),
    VT.UINT64: (0, 2**64 - 1), VT.INT64: (-(2**63), 2**63 - 1),
}


def _value_type(value: Any, key: str) -> VT:
    """The GGUF type of a plain Python value of a key llama.cpp does not read."""
    if isinstance(value, (bool, np.bool_)):
        return VT.BOOL
    if isinstance(value, (int, np.integer)):
        v = int(value)
        if 0 <= v < 2**32:
            return VT.UINT32
        if -(2**31) <= v < 0:
            return VT.INT32
        if 0 <= v < 2**64:
            return VT.UINT64
        return VT.INT64
    if isinstance(value, (float, np.floating)):
        return VT.FLOAT32
    if isinstance(value, (str, bytes)):
        return VT.STRING
    if isinstance(value, (list, tuple, np.ndarray)):
        return VT.ARRAY
    raise ArgumentError(f"write_gguf: metadata '{key}' has a value of type {type(value).__name__} "
                        f"that GGUF cannot hold")


def _fits(value: Any, vtype: VT) -> bool:
    """Whether `value` can be written as `vtype` without changing it."""
    if vtype == VT.BOOL:
        return isinstance(value, (bool, np.bool_))
    if vtype in _INT_RANGES:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            return False
        lo, hi = _INT_RANGES[vtype]
        return lo <= int(value) <= hi
    if vtype in (VT.FLOAT32, VT.FLOAT64):
        return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    if vtype == VT.STRING:
        return isinstance(value, (str, bytes))
    return False


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _typed_metadata(key: str, value: Any, arch: str) -> tuple[Any, VT, VT | None]:
    """(value, GGUF type, array item type or None) to write for metadata `key`; ArgumentError naming the key
    when a value does not fit the type llama.cpp reads the key as."""
    if isinstance(value, tuple) and len(value) in (2, 3) and isinstance(value[1], VT):  # explicitly typed
        if len(value) == 3 and not (value[1] == VT.ARRAY and isinstance(value[2], VT)):
            raise ArgumentError(f"write_gguf: metadata '{key}': a typed triple is (values, ARRAY, item type)")
        sub = value[2] if len(value) == 3 else None
        if value[1] == VT.ARRAY and sub is None:
            items = list(value[0])
            sub = _value_type(items[0], key) if items else VT.UINT32
        return value[0], value[1], sub
    want = llama_cpp_key_type(key, arch)
    if want is not None:
        is_list = isinstance(value, (list, tuple, np.ndarray))
        if isinstance(want, tuple):  # an array key
            item = want[1]
            if not is_list:
                raise ArgumentError(f"write_gguf: metadata '{key}' = {_describe(value)}: llama.cpp reads it as an "
                                    f"ARRAY of {item.name}, got a {type(value).__name__}")
            items = list(value)
        elif is_list:  # per-layer values of a scalar key
            item, items = want, list(value)
        else:
            if not _fits(value, want):
                raise ArgumentError(f"write_gguf: metadata '{key}' = {_describe(value)} does not fit "
                                    f"{want.name}, the type llama.cpp reads it as")
            return value, want, None
        for i, x in enumerate(items):
            if not _fits(x, item):
                raise ArgumentError(f"write_gguf: metadata '{key}'[{i}] = {_describe(x)} does not fit "
                                    f"{item.name}, the type llama.cpp reads its entries as")
        if item in (VT.FLOAT32, VT.FLOAT64):
            items = [float(x) for x in items]
        elif item in _INT_RANGES:
            items = [int(x) for x in items]
        return items, VT.ARRAY, item
    vtype = _value_type(value, key)
    if vtype != VT.ARRAY:
        return value, vtype, None
    items = list(value)
    if not items:
        return [], VT.ARRAY, VT.UINT32
    sub = _value_type(items[0], key)
    if sub == VT.UINT32 and any(int(x) < 0 for x in items):
        sub = VT.INT32
    if sub == VT.FLOAT32:
        items = [float(x) for x in items]
    return items, VT.ARRAY, sub


def _tensor_payload(name: str, value: Any, type: GGMLType | None) -> tuple[np.ndarray, GGMLType, tuple[int, ...]]:
    """(bytes or elements to write, ggml type, ne) of one tensor."""
    if isinstance(value, RawTensor):
        t, ne = as_type(value.type), tuple(int(n) for n in value.ne)
        tr = TYPE_TRAITS[t]
        if any(n < 1 for n in ne) or (ne and ne[0] % tr.blck_size):
            raise ArgumentError(f"write_gguf: tensor '{name}' ({t.name}) has ne={list(ne)}: every dimension must be "
                                f">= 1 and ne[0] a multiple of the block size {tr.blck_size}")
        data = np.ascontiguousarray(value.data)
        want = math.prod(ne) // tr.blck_size * tr.type_size
        if data.nbytes != want:
            raise ArgumentError(f"write_gguf: tensor '{name}' ({t.name}, ne={list(ne)}) needs {want} bytes, "
                                f"its data has {data.nbytes}")
        return data, t, ne
    arr = np.asarray(value)
    t = GGMLType.F32 if type is None else as_type(type)
    ne = tuple(reversed(arr.shape))
    tr = TYPE_TRAITS[t]
    if ne and ne[0] % tr.blck_size:
        raise ArgumentError(f"write_gguf: tensor '{name}' has rows of {ne[0]} elements, not a multiple of "
                            f"{t.name}'s block size {tr.blck_size}")
    rows = np.asarray(arr, dtype=np.float32).reshape(-1, ne[0] if ne else 1)
    return np.ascontiguousarray(from_float(t, rows)), t, ne


def _check_alignment(alignment: Any, what: str) -> int:
    if isinstance(alignment, bool) or not isinstance(alignment, numbers.Integral):
        raise ArgumentError(f"write_gguf: {what} must be an integer, got {_describe(alignment)}")
    a = int(alignment)
    if a <= 0 or a & (a - 1) or a > GGUF_MAX_ALIGNMENT:
        raise ArgumentError(f"write_gguf: {what} must be a power of two in 1..{GGUF_MAX_ALIGNMENT}, got {a}")
    return a


def write_gguf(path: str | os.PathLike[str], arch: str, metadata: Mapping[str, Any],
               tensors: Mapping[str, Any], types: Mapping[str, GGMLType] | None = None,
               alignment: int | None = None) -> None:
    """Write a GGUF file: `general.architecture` = `arch`, the `metadata`, and `tensors` in order.

    A tensor is a float array in numpy order (reversed `ne`), written as
    `types[name]` (default F32), or a `RawTensor`. `alignment` (or metadata
    `general.alignment`) sets the data alignment (default 32). Bad metadata
    or tensors raise ArgumentError before the file is created.
    """
    import gguf

    types = types or {}
    meta = dict(metadata)
    meta.pop("general.architecture", None)
    if "general.alignment" in meta:
        value = meta.pop("general.alignment")
        value = value[0] if isinstance(value, tuple) else value
        value = _check_alignment(value, "metadata 'general.alignment'")
        if alignment is not None and int(alignment) != value:
            raise ArgumentError(f"write_gguf: alignment={alignment} and metadata 'general.alignment' = {value} "
                                f"disagree")
        alignment = value
    if alignment is not None:
        alignment = _check_alignment(alignment, "alignment")
    # everything is typed and converted before the file is opened: a bad value leaves no file behind
    typed = [(key, *_typed_metadata(key, value, arch)) for key, value in meta.items()]
    payloads = [(name, *_tensor_payload(name, value, types.get(name))) for name, value in tensors.items()]
    out = os.fspath(path)
    writer = gguf.GGUFWriter(out, arch)
    started = ok = False
    try:
        if alignment is not None:
            writer.add_custom_alignment(alignment)
        for key, value, vtype, sub in typed:
            writer.add_key_value(key, value, vtype, sub_type=sub)
        for name, data, t, ne in payloads:
            if t in (GGMLType.F32, GGMLType.F16) and data.dtype != np.uint8:
                writer.add_tensor(name, data.reshape(tuple(reversed(ne))) if ne else data)
            else:
                tr = TYPE_TRAITS[t]
                ne_bytes = [*ne] or [1]
                ne_bytes[0] = ne_bytes[0] // tr.blck_size * tr.type_size  # the package takes the byte shape
                writer.add_tensor(name, data.view(np.uint8).reshape(tuple(reversed(ne_bytes))),
                                  raw_dtype=gguf.GGMLQuantizationType(int(t)))
        started = True
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        ok = True
    except (ValueError, TypeError, KeyError) as e:  # the package's complaints (duplicate names, bad shapes)
        raise GGUFError(f"write_gguf '{out}': {type(e).__name__}: {e}") from None
    finally:
        writer.close()
        if started and not ok and os.path.exists(out):
            os.remove(out)  # no half-written file

