"""Real llama.cpp (llama-completion and llama-debug of 0c1e570) offloads every layer (`--rpc -ngl 99`) to
`pyggml rpc-server -b torch` (matmul precision f32, `--no-fallback`: a node torch lacked would be refused, so
every node of llama.cpp's graphs runs on torch): the same greedy text as llama.cpp alone and the last token's
logits within NMSE 1e-5, on the built-in model and on SmolLM2 F32, flash attention on and off."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from rpc_util import free_port, wait_listening
from test_llamacpp_client import completion

from pyggml.models.builtin import builtin_model_path
from pyggml.testing import llamacpp

pytest.importorskip("torch")

PROMPT = "The module is a string"
NMSE = 1e-5


@pytest.fixture(scope="module")
def tools(completion_tool: Path) -> dict[str, Path]:
    """llama-debug and llama-quantize beside llama-completion (built where missing)."""
    try:
        return llamacpp.require_tools(["llama-debug", "llama-quantize"])
    except llamacpp.NoCompilerError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def torch_server() -> Iterator[str]:
    """`pyggml rpc-server -b torch:cpu,matmul_precision=f32 --no-fallback` on a free port."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pyggml.cli", "rpc-server", "-b", "torch:cpu,matmul_precision=f32",
                             "--no-fallback", "-p", str(port), "-t", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        wait_listening(port, proc, timeout=60)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
        assert b"does not support op" not in err, err.decode(errors="replace")[-2000:]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path, tools: dict[str, Path]) -> dict[str, Path]:
    """The built-in model, and SmolLM2 requantized to F32 by llama-quantize."""
    f32 = tmp_path_factory.mktemp("smollm2") / "SmolLM2-F32.gguf"
    subprocess.run([str(tools["llama-quantize"]), "--allow-requantize", str(smollm2_path), str(f32), "F32"],
                   check=True, capture_output=True)
    return {"builtin": builtin_model_path(), "smollm2-f32": f32}


def last_logits(tool: Path, model: Path, flash_attn: str, rpc: str | None, out: Path) -> np.ndarray:
    cmd = [str(tool), "-m", str(model), "-p", PROMPT, "--save-logits", "--logits-output-dir", str(out), "-fa",
           flash_attn, "-c", "128", "-t", "2", "--no-warmup"] + (["--rpc", rpc, "-ngl", "99"] if rpc else [])
    r = subprocess.run(cmd, capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-3000:]
    (path,) = [p for p in out.glob("*.bin") if not p.name.endswith("-tokens.bin")]
    return np.fromfile(path, dtype=np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["builtin", "smollm2-f32"])
@pytest.mark.parametrize("flash_attn", ["off", "on"])
def test_llamacpp_offloads_every_layer_to_the_torch_backend(completion_tool: Path, tools: dict[str, Path],
                                                            torch_server: str, models: dict[str, Path], name: str,
                                                            flash_attn: str, tmp_path: Path) -> None:
    model = models[name]
    remote = completion(completion_tool, model, flash_attn, torch_server)
    assert remote, "llama.cpp generated nothing"
    assert remote == completion(completion_tool, model, flash_attn, None)
    theirs = last_logits(tools["llama-debug"], model, flash_attn, None, tmp_path / "alone")
    ours = last_logits(tools["llama-debug"], model, flash_attn, torch_server, tmp_path / "rpc")
    assert ours.shape == theirs.shape and np.abs(theirs).max() > 1
    nmse = float(np.sum((ours - theirs) ** 2) / np.sum(theirs**2))
    assert nmse < NMSE, nmse
