"""A mixture of experts mapped from its file: one token reads the pages of the experts it uses and not the
others' (the kernel's read-around would pull in megabytes beside each touched page)."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import numpy as np
import pytest

import pyggml.models as pm
from pyggml.gguf.reader import read_gguf
from pyggml.models.convert import simple_vocab
from pyggml.testing.random_moe import MoeShape, write_random_qwen3moe

SHAPE = MoeShape(n_embd=256, n_layer=1, n_head=4, n_head_kv=2, head_dim=64, n_expert=32, n_expert_used=2,
                 n_ff_exp=1024, n_vocab=300, n_ctx_train=64)  # 512 KiB an expert matrix (F16)


def _drop_from_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _resident_pages(path: Path) -> np.ndarray:
    """mincore of a fresh mapping of `path`: 1 for each page of the file in the page cache."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = os.path.getsize(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
        view = np.frombuffer(m, np.uint8)
        vec = (ctypes.c_ubyte * (-(-size // mmap.PAGESIZE)))()
        rc = libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size), vec)
        del view
    assert rc == 0, os.strerror(ctypes.get_errno())
    return np.frombuffer(vec, np.uint8) & 1


def test_one_token_reads_only_its_experts(tmp_path: Path) -> None:
    path = write_random_qwen3moe(tmp_path / "moe.gguf", SHAPE, vocab=simple_vocab(SHAPE.n_vocab))
    _drop_from_page_cache(path)
    if _resident_pages(path).any():
        pytest.skip(f"the page cache of {tmp_path} keeps the file (tmpfs?): residency cannot be observed")
    model = pm.load(path, backends=["cpu"], n_ctx=16, progress=False)
    try:
        model.eval([5])
        pages = _resident_pages(path)
    finally:
        model.free()
    gf = read_gguf(path)
    used: list[set[int]] = []
    for name in ("blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight"):
        info = gf.tensor(name)
        per_expert = info.nbytes // SHAPE.n_expert // mmap.PAGESIZE
        first = -(-info.offset // mmap.PAGESIZE)
        share = [pages[first + e * per_expert: first + (e + 1) * per_expert].mean() for e in range(SHAPE.n_expert)]
        used.append({e for e, s in enumerate(share) if s > 0.5})
        assert len(used[-1]) == SHAPE.n_expert_used, (name, np.round(share, 2))
        assert sum(share) < SHAPE.n_expert_used + 1, (name, np.round(share, 2))  # the rest: a few pages at most
    assert used[0] == used[1] == used[2]
    assert pages[gf.tensor("blk.0.attn_q.weight").offset // mmap.PAGESIZE]  # the dense weights were read
