"""GGUF reading, writing and loading, and the errors of bad files (no torch needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pyggml.models as pm
from pyggml.core import memory
from pyggml.core.errors import GGMLError, GGUFError
from pyggml.core.quants import from_float, to_float
from pyggml.core.types import GGMLType
from pyggml.ggml_backend.tensor_io import tensor_get_numpy
from pyggml.gguf import RawTensor, load_tensors, read_gguf, write_gguf
from pyggml.models.convert import permute, unpermute, write_llama_gguf

CFG = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0)


def numpy_state(cfg: dict = CFG, seed: int = 0) -> dict[str, np.ndarray]:
    """HF-named LLaMA weights of `cfg` (random)."""
    rng = np.random.default_rng(seed)
    e, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = e // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    st = {"model.embed_tokens.weight": (v, e), "model.norm.weight": (e,), "lm_head.weight": (v, e)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        st.update({p + "input_layernorm.weight": (e,), p + "self_attn.q_proj.weight": (e, e),
                   p + "self_attn.k_proj.weight": (kv, e), p + "self_attn.v_proj.weight": (kv, e),
                   p + "self_attn.o_proj.weight": (e, e), p + "post_attention_layernorm.weight": (e,),
                   p + "mlp.gate_proj.weight": (f, e), p + "mlp.up_proj.weight": (f, e),
                   p + "mlp.down_proj.weight": (e, f)})
    return {k: (0.1 * rng.standard_normal(s)).astype(np.float32) for k, s in st.items()}


@pytest.fixture
def llama_file(tmp_path: Path) -> Path:
    path = tmp_path / "m.gguf"
    write_llama_gguf(path, CFG, numpy_state())
    return path


def test_write_read_roundtrip(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 64)).astype(np.float32)
    q = from_float(GGMLType.Q4_0, rng.standard_normal((2, 64)).astype(np.float32))
    meta = {"test.u32": 7, "test.neg": -3, "test.big": 2**40, "test.f": 1.5, "test.s": "héllo", "test.b": True,
            "test.arr": [1, 2, 3], "test.strs": ["a", "bc"], "test.floats": [0.5, -1.0]}
    write_gguf(tmp_path / "t.gguf", "llama", meta,
               {"a": a, "h": a, "q8": a, "raw": RawTensor(q, GGMLType.Q4_0, (64, 2))},
               types={"h": GGMLType.F16, "q8": GGMLType.Q8_0})
    gf = read_gguf(tmp_path / "t.gguf")
    assert gf.architecture == "llama"
    for k, v in meta.items():
        assert gf.get(k) == v, k
    assert gf.get("nope", 5) == 5
    with pytest.raises(GGUFError, match="'t.gguf': metadata key 'nope' is missing"):
        gf.get("nope")
    info = gf.tensor("a")
    assert info.type == GGMLType.F32 and info.ne == (64, 3) and info.nbytes == 3 * 64 * 4
    assert (info.offset - gf.data_offset) % gf.alignment == 0
    assert np.array_equal(gf.tensor_float("a"), a)
    assert gf.tensor("h").type == GGMLType.F16 and np.array_equal(gf.tensor_float("h"), a.astype(np.float16))
    assert gf.tensor("q8").type == GGMLType.Q8_0
    assert np.array_equal(gf.tensor_float("q8"), to_float(GGMLType.Q8_0, from_float(GGMLType.Q8_0, a), 64))
    assert gf.tensor("raw").ne == (64, 2)
    assert np.array_equal(np.asarray(gf.tensor_bytes("raw")).reshape(q.shape), q)


def test_permute_roundtrip_and_layout() -> None:
    w = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)  # 2 heads of 4 rows
    p = permute(w, 2, 2)
    # per head: rows [0, 2, 1, 3] (first half and second half interleaved)
    assert np.array_equal(p[:4], w[[0, 2, 1, 3]]) and np.array_equal(p[4:], w[[4, 6, 5, 7]])
    assert np.array_equal(unpermute(p, 2, 2), w)
    assert np.array_equal(unpermute(permute(w, 4, 2), 4, 2), w)


def test_load_zero_copy_from_the_mapping(llama_file: Path) -> None:
    gf = read_gguf(llama_file)
    from pyggml.backends.cpu import cpu_init

    be = cpu_init(1)
    names = ["token_embd.weight", "blk.0.attn_q.weight"]
    lt = load_tensors(gf, names, {n: be for n in names}, progress=False)
    for n in names:
        t = lt.tensors[n]
        assert t.buffer.name.startswith("CPU mmap")
        array, off = memory.find(t.data, t.nbytes())
        assert np.shares_memory(array, gf.data)  # the weight is the file's bytes, not a copy
        assert np.array_equal(tensor_get_numpy(t).view(np.uint8).reshape(-1), np.asarray(gf.tensor_bytes(n)))
    assert lt.zero_copy[id(be)]
    copied = load_tensors(gf, names, lambda n: be, use_mmap=False, progress=False)
    assert not copied.zero_copy[id(be)]
    for n in names:
        t = copied.tensors[n]
        array, _ = memory.find(t.data, t.nbytes())
        assert not np.shares_memory(array, gf.data)
        assert np.array_equal(tensor_get_numpy(t), tensor_get_numpy(lt.tensors[n]))
    lt.free()
    copied.free()


def test_mmap_and_copied_models_agree(llama_file: Path) -> None:
    ids = [1, 5, 9, 200, 33]
    a = pm.load(llama_file, n_ctx=16, progress=False).eval(ids)
    b = pm.load(llama_file, n_ctx=16, progress=False, use_mmap=False).eval(ids)
    assert np.array_equal(a, b)


# --- bad files ---


def test_missing_file_and_not_gguf(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match="cannot open"):
        read_gguf(tmp_path / "absent.gguf")
    (tmp_path / "x.gguf").write_bytes(b"GGML" + bytes(100))
    with pytest.raises(GGUFError, match=r"'x.gguf' is not a GGUF file \(magic b'GGML'"):
        read_gguf(tmp_path / "x.gguf")
    (tmp_path / "short.gguf").write_bytes(b"GGUF")
    with pytest.raises(GGUFError, match="truncated: 4 bytes"):
        read_gguf(tmp_path / "short.gguf")


@pytest.mark.parametrize("cut", ["header", "data"])
def test_truncated_file(llama_file: Path, tmp_path: Path, cut: str) -> None:
    raw = llama_file.read_bytes()
    gf = read_gguf(llama_file)
    n = gf.data_offset // 2 if cut == "header" else len(raw) - 100
    (tmp_path / "cut.gguf").write_bytes(raw[:n])
    with pytest.raises(GGUFError) as e:
        read_gguf(tmp_path / "cut.gguf")
    msg = str(e.value)
    assert "'cut.gguf'" in msg
    if cut == "data":  # names the last tensor and the numbers
        last = max(gf, key=lambda i: i.offset)
        assert f"tensor '{last.name}'" in msg and f"the file has {n} bytes" in msg
        assert f"{last.offset}..{last.offset + last.nbytes}" in msg


def test_corrupt_metadata(llama_file: Path, tmp_path: Path) -> None:
    raw = bytearray(llama_file.read_bytes())
    raw[16:24] = (10**9).to_bytes(8, "little")  # kv_count far beyond the file
    (tmp_path / "bad.gguf").write_bytes(bytes(raw))
    with pytest.raises(GGUFError, match=r"'bad.gguf': GGUF header: .* 1000000000 metadata keys \(count at byte 16\) "
                                        r"need at least \d+ bytes but only \d+ remain"):
        read_gguf(tmp_path / "bad.gguf")


def test_unsupported_tensor_type(llama_file: Path, tmp_path: Path) -> None:
    gf = read_gguf(llama_file)
    info = gf.tensor("output_norm.weight")
    # the tensor info's type field follows name length, name, n_dims and the dims
    type_offset = info.info_offset + 8 + len(info.name) + 4 + 8 * len(info.ne)
    raw = bytearray(llama_file.read_bytes())
    assert int.from_bytes(raw[type_offset: type_offset + 4], "little") == 0  # F32
    raw[type_offset: type_offset + 4] = (77).to_bytes(4, "little")
    (tmp_path / "ty.gguf").write_bytes(bytes(raw))
    with pytest.raises(GGUFError, match=f"'ty.gguf': tensor 'output_norm.weight' at byte {info.info_offset}: "
                                        f"unknown ggml type 77 at byte {type_offset}"):
        read_gguf(tmp_path / "ty.gguf")


def test_unsupported_architecture(tmp_path: Path) -> None:
    write_gguf(tmp_path / "g.gguf", "gpt2", {"gpt2.block_count": 1}, {"x": np.zeros(4, np.float32)})
    with pytest.raises(GGUFError, match=r"'g.gguf': unsupported architecture 'gpt2' "
                                        r"\(supported: llama, qwen2, qwen3, gemma3, phi3, qwen3moe, olmo2, gemma2, "
                                        r"smollm3, granite, granitemoe, gpt-oss, lfm2, granitehybrid\)"):
        pm.load(tmp_path / "g.gguf", progress=False)


def test_missing_tensor_and_wrong_shape(tmp_path: Path) -> None:
    st = numpy_state()
    del st["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(KeyError):
        write_llama_gguf(tmp_path / "m.gguf", CFG, st)
    # a file without the tensor (written directly)
    full = tmp_path / "full.gguf"
    write_llama_gguf(full, CFG, numpy_state())
    gf = read_gguf(full)
    meta = {k: gf.get(k) for k in gf.keys() if k != "general.architecture"}
    tensors = {i.name: gf.tensor_float(i.name) for i in gf if i.name != "blk.1.ffn_up.weight"}
    write_gguf(tmp_path / "miss.gguf", "llama", meta, tensors)
    with pytest.raises(GGUFError, match="'miss.gguf': tensor 'blk.1.ffn_up.weight' is missing"):
        pm.load(tmp_path / "miss.gguf", progress=False)
    tensors = {i.name: gf.tensor_float(i.name) for i in gf}
    tensors["blk.0.ffn_gate.weight"] = tensors["blk.0.ffn_gate.weight"][:64]
    write_gguf(tmp_path / "shape.gguf", "llama", meta, tensors)
    with pytest.raises(GGUFError, match=r"tensor 'blk.0.ffn_gate.weight' has ne=\[64, 64\], .* want \[64, 96\]"):
        pm.load(tmp_path / "shape.gguf", progress=False)


def test_errors_are_ggml_errors() -> None:
    assert issubclass(GGUFError, GGMLError)


def test_tokenize_detokenize_through_the_files_vocab(llama_file: Path) -> None:
    import pyggml.models.tokenizer as tok_mod
    model = pm.load(llama_file, n_ctx=64, progress=False)
    ref = tok_mod.Tokenizer.from_gguf(read_gguf(llama_file))
    text = "the word is hot, 42!"
    ids = model.tokenize(text)
    assert ids == list(ref.encode(text, True)) and ids[0] == 1  # BOS
    assert model.tokenize(text, add_bos=False) == ids[1:]
    assert model.detokenize(ids[1:]).strip() == text
    gen = list(model.generate(text, 3, stop_at_eos=False))
    model.reset()
    assert gen == list(model.generate(ids, 3, stop_at_eos=False))


def test_layer_placement_like_n_gpu_layers() -> None:
    from pyggml.core.errors import ArgumentError
    from pyggml.models.model import _layer_backends

    a, b, c = object(), object(), object()
    assert _layer_backends(4, [a, b], None) == [a] * 4  # type: ignore[list-item]
    assert _layer_backends(4, [a, b], 1) == [a, b, b, b]  # type: ignore[list-item]
    assert _layer_backends(4, [a, b], [0]) == [b] * 4  # type: ignore[list-item]
    assert _layer_backends(4, [a, b], [9]) == [a] * 4  # type: ignore[list-item]
    assert _layer_backends(5, [a, b, c], [2, 1]) == [a, a, b, c, c]  # type: ignore[list-item]
    assert _layer_backends(3, [a, b], [1, 1]) == [a, b, b]  # type: ignore[list-item]
    with pytest.raises(ArgumentError, match="3 counts for 2 backends"):
        _layer_backends(3, [a, b], [1, 1, 1])  # type: ignore[list-item]
    with pytest.raises(ArgumentError, match=">= 0"):
        _layer_backends(3, [a, b], [-1])  # type: ignore[list-item]


def test_model_placement_and_empty_eval(llama_file: Path) -> None:
    from pyggml.backends.cpu import cpu_init

    a, b = cpu_init(1), cpu_init(1)
    model = pm.load(llama_file, backends=[a, b], n_layers_on=[1], n_ctx=16, progress=False)
    w = model.w
    assert w["token_embd.weight"].buffer.backend is a and w["blk.0.attn_q.weight"].buffer.backend is a
    assert w["blk.1.attn_q.weight"].buffer.backend is b and w["output.weight"].buffer.backend is b
    assert model.kv.k[0].buffer.backend is a and model.kv.v[1].buffer.backend is b
    assert model.eval([]).shape == (0, 300)
    assert model.n_past == 0
    with pytest.raises(GGMLError, match="no ids"):
        model.eval_last([])


def _mapping_rss_kib(address: int) -> int:
    """The resident size of the mapping holding `address`, from /proc/self/smaps."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("Rss:"):
            return int(line.split()[1])
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads resident sizes from Linux's smaps")
def test_a_copied_tensor_s_pages_leave_the_process(tmp_path: Path) -> None:
    """release_pages (the loader's, after a weight is copied out, e.g. repacked): the mapping's pages wholly
    inside the tensor are no longer resident in the process; its bytes read the same afterwards."""
    path = tmp_path / "big.gguf"
    values = np.arange(1 << 20, dtype=np.float32)  # 4 MiB
    write_gguf(path, "llama", {}, {"a": values[:1000], "w": values})
    gf = read_gguf(path)
    try:
        address = gf.data.ctypes.data
        assert float(gf.tensor_bytes("w").view(np.float32).sum()) > 0  # every page of w faulted in
        before = _mapping_rss_kib(address)
        gf.release_pages("w")
        after = _mapping_rss_kib(address)
        assert before >= 4096 and before - after >= 4096 - 8, (before, after)
        assert np.array_equal(gf.tensor_bytes("w").view(np.float32), values)
    finally:
        gf.close()
