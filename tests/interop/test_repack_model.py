"""A Q4_0 model loads its layer matrices into the CPU's CPU_REPACK buffer (as llama.cpp does on x86), and gives
what llama.cpp gives.

The built-in model made Q4_0 by llama.cpp's own llama-quantize. Loaded with `repack` (the default), every
2-D layer weight sits in a CPU_REPACK buffer and the token embedding (read by GET_ROWS) does not; with
`repack=False` (llama.cpp's --no-repack) there is no such buffer. Both give llama.cpp's logits (llama-debug,
which repacks Q4_0 on this kind of CPU) within the float order's reach.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from pyggml.models import load
from pyggml.models.builtin import builtin_model_path
from pyggml.testing import llamacpp

PROMPT = "The module is a string, and the"


@pytest.fixture(scope="module")
def q4_0_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        quantize = llamacpp.require_tools(["llama-quantize"])["llama-quantize"]
    except llamacpp.NoCompilerError as e:
        pytest.skip(str(e))
    out = tmp_path_factory.mktemp("q4_0") / "builtin-Q4_0.gguf"
    subprocess.run([str(quantize), str(builtin_model_path()), str(out), "Q4_0"], check=True, capture_output=True)
    return out


def test_layer_matrices_go_to_cpu_repack_and_give_llamacpp_logits(q4_0_model: Path, llamacpp_tools: dict[str, Path],
                                                                    tmp_path: Path) -> None:
    subprocess.run([str(llamacpp_tools["llama-debug"]), "-m", str(q4_0_model), "-p", PROMPT, "--save-logits",
                    "--logits-output-dir", str(tmp_path), "-ctk", "f32", "-ctv", "f32", "-fa", "off", "-c", "128",
                    "-t", "2", "--no-warmup"], check=True, capture_output=True)
    stem = tmp_path / f"llamacpp-{q4_0_model.stem}"
    theirs = np.fromfile(f"{stem}.bin", dtype=np.float32)
    ids = np.fromfile(f"{stem}-tokens.bin", dtype=np.int32).tolist()
    logits = {}
    for repack in (True, False):
        model = load(q4_0_model, n_ctx=128, n_threads=2, progress=False, repack=repack)
        try:
            names = {b.buft.name() if b.buft is not None else None for b in model.weights.buffers}
            held = {n for n, t in model.w.items() if t.buffer is not None and t.buffer.buft is not None
                    and t.buffer.buft.name() == "CPU_REPACK"}
            if repack:
                want = {n for n, t in model.w.items() if n.startswith("blk.") and t.ne[1] > 1 and t.ne[1] % 8 == 0
                        and t.type.name == "Q4_0"}
                assert want and held == want
                assert "token_embd.weight" not in held
            else:
                assert "CPU_REPACK" not in names and not held
            logits[repack] = model.eval_last(ids)
        finally:
            model.free()
    for ours in logits.values():
        nmse = float(np.mean((ours - theirs) ** 2) / np.mean(theirs**2))
        assert nmse < 1e-9, nmse  # measured: 5.6e-14 with and without repacking (max |diff| 2e-6)
        assert int(np.argmax(ours)) == int(np.argmax(theirs))
