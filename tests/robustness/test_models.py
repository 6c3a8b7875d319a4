"""Bad-input catalog of the models: hyper-parameters, tensors, context size, non-finite logits.

Every bad file is the built-in model copied with one thing changed (`copy_model`: every key with its
GGUF type and every tensor's bytes, one key's value or type overridden, a tensor replaced, added or
dropped). Each case asserts the error class, that the message names the key or tensor and the
numbers, that a failed load leaves no host memory behind, and that the built-in model still loads and
generates the same greedy tokens afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFValueType as VT
from gguf import GGUFWriter

import pyggml.models as pm
from pyggml.backends.cpu import cpu_init
from pyggml.core import memory
from pyggml.core.errors import (
    ArgumentError,
    ArgumentTypeError,
    GGMLError,
    GGUFError,
    ModelError,
    NonFiniteError,
    OutOfMemoryError,
)
from pyggml.core.types import TYPE_TRAITS
from pyggml.gguf.reader import read_gguf
from pyggml.models.builtin import builtin_model_path
from robustness.conftest import expect_error

# the NaN and inf the non-finite cases make are reported by the model; numpy's warnings about them are expected
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:overflow encountered:RuntimeWarning")

BUILTIN = builtin_model_path()
PROMPT = [1, 344, 541]  # "The module" (BOS first): what `generate` continues in the follow-up checks
N_GEN = 6


def copy_model(dst: Path, overrides: Mapping[str, tuple[Any, ...]] | None = None, drop: Sequence[str] = (),
               tensors: Mapping[str, np.ndarray] | None = None, extra: Mapping[str, np.ndarray] | None = None,
               src: Path = BUILTIN) -> Path:
    """Write `src` again as `dst`: every metadata key with its own GGUF type, in order, and every tensor's
    bytes; `overrides[key] = (value, GGUFValueType[, array item type])` replaces (or adds) a key, `drop`
    leaves keys or tensors out, `tensors` replaces tensors' values (numpy order: reversed ne), `extra`
    adds tensors. With nothing changed the copy is byte-identical to `src` (tested below)."""
    overrides = dict(overrides or {})
    tensors = dict(tensors or {})
    gf = read_gguf(src)
    writer = GGUFWriter(str(dst), str(gf.get("general.architecture")))
    writer.kv_data[0].pop("general.architecture")  # written again below with the file's order and any override
    for key, field in gf.fields.items():
        if key.startswith("GGUF.") or key in drop:
            continue
        if key in overrides:
            value, vtype, *sub = overrides.pop(key)
            writer.add_key_value(key, value, vtype, sub_type=sub[0] if sub else None)
        else:
            vtype = field.types[0]
            writer.add_key_value(key, gf.get(key), vtype, sub_type=field.types[-1] if vtype == VT.ARRAY else None)
    for key, (value, vtype, *sub) in overrides.items():
        writer.add_key_value(key, value, vtype, sub_type=sub[0] if sub else None)
    for info in gf:
        if info.name in drop:
            continue
        if info.name in tensors:
            writer.add_tensor(info.name, np.ascontiguousarray(tensors[info.name]))
            continue
        dtype = TYPE_TRAITS[info.type].np_dtype
        writer.add_tensor(info.name, np.array(gf.tensor_bytes(info.name).view(dtype).reshape(info.ne[::-1])))
    for name, values in (extra or {}).items():
        writer.add_tensor(name, np.ascontiguousarray(values))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    gf.close()
    return dst


def load(path: Path, **kw: Any) -> pm.Model:
    kw.setdefault("n_ctx", 64)
    return pm.load(path, n_threads=1, progress=False, **kw)


@pytest.fixture(scope="module")
def reference_tokens() -> list[int]:
    """The built-in model's greedy continuation of PROMPT, from a load before any bad file."""
    model = load(BUILTIN)
    try:
        return list(model.generate(PROMPT, N_GEN, stop_at_eos=False))
    finally:
        model.free()


def assert_builtin_still_works(reference: list[int]) -> None:
    model = load(BUILTIN)
    try:
        assert list(model.generate(PROMPT, N_GEN, stop_at_eos=False)) == reference
    finally:
        model.free()


def test_copy_model_without_changes_is_the_same_file(tmp_path: Path) -> None:
    """The helper itself: a copy with nothing changed is byte-identical, so a case's file differs from the
    built-in model by exactly its override."""
    assert copy_model(tmp_path / "same.gguf").read_bytes() == BUILTIN.read_bytes()


# --- hyper-parameters: (id, overrides, drop, fragments of the message) ---

EPS = "llama.attention.layer_norm_rms_epsilon"
HPARAM_CASES: list[tuple[str, dict[str, tuple[Any, ...]], tuple[str, ...], tuple[str, ...]]] = [
    ("eps-negative", {EPS: (-1e-5, VT.FLOAT32)}, (), (f"'{EPS}' = -1e-05", "must be > 0")),
    ("eps-zero", {EPS: (0.0, VT.FLOAT32)}, (), (f"'{EPS}' = 0 ", "must be > 0")),
    ("eps-nan", {EPS: (math.nan, VT.FLOAT32)}, (), (f"'{EPS}' = nan", "finite")),
    ("eps-inf", {EPS: (math.inf, VT.FLOAT32)}, (), (f"'{EPS}' = inf", "finite")),
    ("eps-uint32", {EPS: (1, VT.UINT32)}, (), (f"'{EPS}' has GGUF type UINT32", "expected FLOAT32")),
    ("eps-string", {EPS: ("1e-5", VT.STRING)}, (), (f"'{EPS}' has GGUF type STRING", "expected FLOAT32")),
    ("n_embd-string", {"llama.embedding_length": ("256", VT.STRING)}, (),
     ("'llama.embedding_length' has GGUF type STRING", "expected an integer type")),
    ("n_embd-float", {"llama.embedding_length": (256.0, VT.FLOAT32)}, (),
     ("'llama.embedding_length' has GGUF type FLOAT32", "expected an integer type")),
    ("n_embd-zero", {"llama.embedding_length": (0, VT.UINT32)}, (), ("'llama.embedding_length' = 0", ">= 1")),
    ("n_embd-missing", {}, ("llama.embedding_length",), ("'llama.embedding_length' is missing",)),
    ("n_layer-array", {"llama.block_count": ([4], VT.ARRAY, VT.UINT32)}, (),
     ("'llama.block_count' has GGUF type ARRAY of UINT32", "expected an integer type")),
    ("n_layer-bool", {"llama.block_count": (True, VT.BOOL)}, (), ("'llama.block_count' has GGUF type BOOL",)),
    ("n_layer-zero", {"llama.block_count": (0, VT.UINT32)}, (), ("'llama.block_count' = 0", ">= 1")),
    ("n_ff-negative", {"llama.feed_forward_length": (-688, VT.INT32)}, (),
     ("'llama.feed_forward_length' = -688", ">= 1")),
    ("n_ff-huge", {"llama.feed_forward_length": (2**40, VT.UINT64)}, (),
     (f"'llama.feed_forward_length' = {2**40}", "<= 2147483647")),
    ("heads-not-dividing", {"llama.attention.head_count": (3, VT.UINT32)}, (),
     ("'llama.embedding_length' = 256 is not a multiple of 'llama.attention.head_count' = 3",)),
    ("heads-zero", {"llama.attention.head_count": (0, VT.UINT32)}, (),
     ("'llama.attention.head_count' = 0", ">= 1")),
    ("kv-heads-not-dividing", {"llama.attention.head_count_kv": (3, VT.UINT32)}, (),
     ("'llama.attention.head_count' = 4 is not a multiple of 'llama.attention.head_count_kv' = 3",)),
    ("kv-heads-zero", {"llama.attention.head_count_kv": (0, VT.UINT32)}, (),
     ("'llama.attention.head_count_kv' = 0", ">= 1")),
    ("rope-dims-over-head", {"llama.rope.dimension_count": (128, VT.UINT32)}, (),
     ("'llama.rope.dimension_count' = 128", "head size 64")),
    ("rope-dims-odd", {"llama.rope.dimension_count": (63, VT.UINT32)}, (),
     ("'llama.rope.dimension_count' = 63", "even")),
    ("rope-dims-zero", {"llama.rope.dimension_count": (0, VT.UINT32)}, (),
     ("'llama.rope.dimension_count' = 0", ">= 1")),
    ("rope-base-zero", {"llama.rope.freq_base": (0.0, VT.FLOAT32)}, (), ("'llama.rope.freq_base' = 0", "> 0")),
    ("rope-base-negative", {"llama.rope.freq_base": (-10000.0, VT.FLOAT32)}, (),
     ("'llama.rope.freq_base' = -10000", "> 0")),
    ("rope-scale-negative", {"llama.rope.scaling.factor": (-2.0, VT.FLOAT32)}, (),
     ("'llama.rope.scaling.factor' = -2", ">= 0")),
    ("n_ctx_train-zero", {"llama.context_length": (0, VT.UINT32)}, (), ("'llama.context_length' = 0", ">= 1")),
    ("arch-uint32", {"general.architecture": (7, VT.UINT32)}, (),
     ("'general.architecture' has GGUF type UINT32", "expected STRING")),
    ("arch-gpt2", {"general.architecture": ("gpt2", VT.STRING)}, (), ("unsupported architecture 'gpt2'",)),
    ("tokens-uint32", {"tokenizer.ggml.tokens": (list(range(2000)), VT.ARRAY, VT.UINT32)}, (),
     ("'tokenizer.ggml.tokens' has GGUF type ARRAY of UINT32", "expected ARRAY of STRING")),
    ("bos-string", {"tokenizer.ggml.bos_token_id": ("1", VT.STRING)}, (),
     ("'tokenizer.ggml.bos_token_id' has GGUF type STRING", "expected an integer type")),
    ("eos-array", {"tokenizer.ggml.eos_token_id": ([2], VT.ARRAY, VT.INT32)}, (),
     ("'tokenizer.ggml.eos_token_id' has GGUF type ARRAY of INT32",)),
]


@pytest.mark.parametrize("overrides, drop, fragments", [c[1:] for c in HPARAM_CASES],
                         ids=[c[0] for c in HPARAM_CASES])
@pytest.mark.slow
def test_bad_hyper_parameter(tmp_path: Path, reference_tokens: list[int], overrides: dict[str, tuple[Any, ...]],
                             drop: tuple[str, ...], fragments: tuple[str, ...]) -> None:
    path = copy_model(tmp_path / "bad.gguf", overrides, drop)
    n_host = len(memory._bases)
    err = expect_error(lambda: load(path), ModelError, "'bad.gguf'", *fragments)
    assert isinstance(err, GGUFError)  # what load raised for bad files before: callers catching it still do
    assert len(memory._bases) == n_host  # nothing of the failed load stays in host memory
    assert_builtin_still_works(reference_tokens)


# --- tensors that do not match the hyper-parameters ---

def _builtin_tensor(name: str) -> np.ndarray:
    gf = read_gguf(BUILTIN)
    try:
        return np.array(gf.tensor_bytes(name).view(TYPE_TRAITS[gf.tensor(name).type].np_dtype)
                        .reshape(gf.tensor(name).ne[::-1]))
    finally:
        gf.close()


TENSOR_CASES: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("attn_q-wrong-shape", {"tensors": {"blk.1.attn_q.weight": np.zeros((128, 256), np.float16)}},
     ("tensor 'blk.1.attn_q.weight' has ne=[256, 128]", "want [256, 256]", "n_embd, n_embd")),
    ("tensor-missing", {"drop": ("blk.3.ffn_up.weight",)},
     ("tensor 'blk.3.ffn_up.weight' is missing", "ne=[256, 688]", "n_embd, n_ff")),
    ("attn_k-for-more-kv-heads", {"overrides": {"llama.attention.head_count_kv": (4, VT.UINT32)}},
     ("tensor 'blk.0.attn_k.weight' has ne=[256, 128]", "want [256, 256]", "n_embd_gqa")),
    ("ffn-for-other-n_ff", {"overrides": {"llama.feed_forward_length": (700, VT.UINT32)}},
     ("tensor 'blk.0.ffn_gate.weight' has ne=[256, 688]", "want [256, 700]")),
    ("norm-with-extra-dim", {"tensors": {"output_norm.weight": np.ones((2, 256), np.float32)}},
     ("tensor 'output_norm.weight' has ne=[256, 2]", "want [256]")),
    ("more-layers-than-tensors", {"overrides": {"llama.block_count": (5, VT.UINT32)}},
     ("tensor 'blk.4.attn_norm.weight' is missing",)),
    ("vocab-of-other-size", {"overrides": {"tokenizer.ggml.tokens": ([f"t{i}" for i in range(1999)], VT.ARRAY,
                                                                      VT.STRING)}},
     ("tensor 'token_embd.weight' has ne=[256, 2000]", "want [256, 1999]", "n_embd, n_vocab")),
]


@pytest.mark.parametrize("change, fragments", [c[1:] for c in TENSOR_CASES], ids=[c[0] for c in TENSOR_CASES])
@pytest.mark.slow
def test_tensor_against_hyper_parameters(tmp_path: Path, reference_tokens: list[int], change: dict[str, Any],
                                         fragments: tuple[str, ...]) -> None:
    path = copy_model(tmp_path / "bad.gguf", **change)
    n_host = len(memory._bases)
    expect_error(lambda: load(path), ModelError, "'bad.gguf'", *fragments)
    assert len(memory._bases) == n_host
    assert_builtin_still_works(reference_tokens)


# --- tokenizer metadata of the wrong type: found when the tokenizer is first used ---

@pytest.mark.parametrize("key, value, fragments", [
    ("tokenizer.ggml.scores", (["x"] * 2000, VT.ARRAY, VT.STRING),
     ("'tokenizer.ggml.scores' has GGUF type ARRAY of STRING", "expected ARRAY of FLOAT32")),
    ("tokenizer.ggml.model", (3, VT.UINT32), ("'tokenizer.ggml.model' has GGUF type UINT32", "expected STRING")),
], ids=["scores-strings", "model-uint32"])
@pytest.mark.slow
def test_tokenizer_metadata_of_the_wrong_type(tmp_path: Path, reference_tokens: list[int], key: str,
                                              value: tuple[Any, ...], fragments: tuple[str, ...]) -> None:
    model = load(copy_model(tmp_path / "tok.gguf", {key: value}))
    try:
        expect_error(lambda: model.tokenize("The module"), ModelError, "'tok.gguf'", *fragments)
        # the weights are fine: the model still evaluates ids, as the built-in model does
        ref = load(BUILTIN)
        assert np.array_equal(model.eval(PROMPT), ref.eval(PROMPT))
        ref.free()
    finally:
        model.free()
    assert_builtin_still_works(reference_tokens)


# --- context and batch sizes ---

def test_context_beyond_memory_is_refused_before_allocating(reference_tokens: list[int]) -> None:
    """n_ctx 10,000,000: the KV cache (2 x 4 layers x 10M cells x 128 x 4 bytes) and at least the attention
    scores and mask of a 512-token batch (10M x 512 x (4 heads + 1) x 4 bytes) are counted before anything
    is allocated, and refused with the bytes requested and available (numpy's MemoryError before)."""
    n_host = len(memory._bases)
    kv = 2 * 4 * 10_000_000 * 128 * 4
    compute = 10_000_000 * 512 * 5 * 4
    err = expect_error(lambda: load(BUILTIN, n_ctx=10_000_000), OutOfMemoryError, "n_ctx 10000000",
                       f"KV cache {kv} bytes", f"compute buffers at least {compute} bytes",
                       f"cannot allocate {kv + compute} bytes")
    assert "bytes" in str(err).split("of host memory, ")[1] and "available" in str(err)
    assert len(memory._bases) == n_host
    assert_builtin_still_works(reference_tokens)


@pytest.mark.parametrize("kwargs, cls, fragments", [
    ({"n_ctx": 0}, ArgumentError, ("n_ctx must be >= 1, got 0",)),
    ({"n_ctx": -5}, ArgumentError, ("n_ctx must be >= 1, got -5",)),
    ({"n_ctx": 64.5}, ArgumentTypeError, ("n_ctx must be an integer", "64.5")),
    ({"n_batch": 0}, ArgumentError, ("n_batch must be >= 1, got 0",)),
    ({"n_batch": "8"}, ArgumentTypeError, ("n_batch must be an integer", "'8'")),
], ids=["n_ctx-zero", "n_ctx-negative", "n_ctx-float", "n_batch-zero", "n_batch-string"])
@pytest.mark.slow
def test_bad_sizes(reference_tokens: list[int], kwargs: dict[str, Any], cls: type[GGMLError],
                   fragments: tuple[str, ...]) -> None:
    n_host = len(memory._bases)
    expect_error(lambda: load(BUILTIN, **kwargs), cls, *fragments)
    assert len(memory._bases) == n_host
    assert_builtin_still_works(reference_tokens)


# --- non-finite logits ---

def _with_value(name: str, index: tuple[int, ...], value: float) -> np.ndarray:
    values = _builtin_tensor(name).copy()
    values[index] = value
    return values


def test_nan_weight_names_the_first_tensor_and_layer(tmp_path: Path, reference_tokens: list[int]) -> None:
    path = copy_model(tmp_path / "nan.gguf", tensors={"blk.2.ffn_down.weight": _with_value(
        "blk.2.ffn_down.weight", (5, 7), math.nan)})
    model = load(path)
    try:
        expect_error(lambda: model.eval(PROMPT), NonFiniteError, "'nan.gguf'", "positions 0..2", "NaN",
                     "'ffn_out-2' (MUL_MAT of 'blk.2.ffn_down.weight'", "in layer 2",
                     "weight 'blk.2.ffn_down.weight' holds 1 NaN and 0 inf")
        assert model.n_past == 0  # the failed batch is not in the cache
        model.check_finite = False  # the check is an option: without it the NaN logits come out
        assert np.isnan(model.eval(PROMPT)).all()
    finally:
        model.free()
    assert_builtin_still_works(reference_tokens)


def test_inf_norm_weight_names_its_layer(tmp_path: Path, reference_tokens: list[int]) -> None:
    path = copy_model(tmp_path / "inf.gguf", tensors={"blk.1.attn_norm.weight": _with_value(
        "blk.1.attn_norm.weight", (3,), math.inf)})
    model = load(path)
    try:
        expect_error(lambda: model.eval_last(PROMPT), NonFiniteError, "'attn_norm-1' (MUL of",
                     "'blk.1.attn_norm.weight') in layer 1", "3 of 768 values (0 NaN, 3 inf)",
                     "weight 'blk.1.attn_norm.weight' holds 0 NaN and 1 inf")
    finally:
        model.free()
    assert_builtin_still_works(reference_tokens)


def test_nan_found_over_two_backends(tmp_path: Path, reference_tokens: list[int]) -> None:
    """Layers 0-1 on one CPU backend, 2-3 on another (the scheduler): the recomputation still names
    the tensor in layer 2."""
    path = copy_model(tmp_path / "nan2.gguf", tensors={"blk.2.ffn_down.weight": _with_value(
        "blk.2.ffn_down.weight", (0, 0), math.nan)})
    model = pm.load(path, backends=[cpu_init(1), cpu_init(1)], n_layers_on=[2], n_ctx=64, progress=False)
    try:
        expect_error(lambda: model.eval(PROMPT), NonFiniteError, "'ffn_out-2'", "in layer 2")
    finally:
        model.free()
    assert_builtin_still_works(reference_tokens)


def test_nan_found_for_a_backend_off_the_host(tmp_path: Path, reference_tokens: list[int]) -> None:
    """The torch backend keeps its tensors off the host: the scheduler's eval callback reads each node
    through the backend as it is computed, and the tensor is still named."""
    path = copy_model(tmp_path / "nan3.gguf", tensors={"blk.2.ffn_down.weight": _with_value(
        "blk.2.ffn_down.weight", (0, 0), math.nan)})
    model = pm.load(path, backends=["torch"], n_ctx=64, progress=False)
    try:
        expect_error(lambda: model.eval(PROMPT), NonFiniteError, "'ffn_out-2'", "in layer 2",
                     "weight 'blk.2.ffn_down.weight' holds 1 NaN")
        assert model.n_past == 0
    finally:
        model.free()
    assert_builtin_still_works(reference_tokens)


@pytest.fixture
def nan_token_model(tmp_path: Path) -> Iterator[pm.Model]:
    """The built-in model whose embedding of token 5 is NaN, with the head as a separate (finite)
    output.weight: a batch goes wrong only when it holds token 5."""
    embd = _builtin_tensor("token_embd.weight")
    path = copy_model(tmp_path / "tok5.gguf", tensors={"token_embd.weight": _with_value("token_embd.weight", (5,),
                                                                                           math.nan)},
                      extra={"output.weight": embd})
    model = load(path)
    yield model
    model.free()


def test_failed_batch_leaves_the_cache_usable(nan_token_model: pm.Model) -> None:
    """A batch with token 5 fails naming the embedding; n_past stays and its cells are zeroed, so the next
    token gives exactly the logits of a clean evaluation (a NaN left in a cell would reach them through
    the padded decode graph even where the mask hides it)."""
    model = nan_token_model
    model.eval([1, 6, 7])
    expect_error(lambda: model.eval([5, 8]), NonFiniteError, "positions 3..4", "'inp_embd' (GET_ROWS of "
                 "'token_embd.weight', 'inp_tokens') in the token embedding", "256 of 512 values (256 NaN, 0 inf)")
    assert model.n_past == 3
    ref = load(BUILTIN)
    try:
        ref.eval([1, 6, 7])  # the same calls, so the same graphs: equal to the bit
        assert np.array_equal(model.eval_last([8]), ref.eval_last([8]))
    finally:
        ref.free()


def test_nan_left_in_the_cache_by_an_unchecked_batch(nan_token_model: pm.Model) -> None:
    """With the check off a NaN batch goes into the cache; after reset, the next batch, whose graph reads the
    cache padded to 256 cells (as llama.cpp pads n_kv), fails naming the attention and the cache cells,
    clears them, and the retry is clean."""
    model = nan_token_model
    model.check_finite = False
    model.eval([1, 6, 7, 5, 8])
    model.reset()
    model.check_finite = True
    attention = "'fattn-0'" if model.flash_attn else "'kq-0'"  # FLASH_ATTN_EXT where the backend has it
    expect_error(lambda: model.eval([1, 6]), NonFiniteError, "positions 0..1", attention, "in layer 0",
                 # cell 3 (token 5) in layer 0: one cell of n_embd_gqa 128 values; cell 4's layer-0 keys come
                 # from token 8's finite embedding
                 "the KV cache cells it reads ('k-0') holds 128 NaN")
    ref = load(BUILTIN)
    try:
        # the same calls, so the same graphs: equal to the bit
        assert np.array_equal(model.eval([1, 6]), ref.eval([1, 6]))
        assert np.array_equal(model.eval_last([7]), ref.eval_last([7]))
    finally:
        ref.free()
