"""Real llama.cpp (llama-completion of 0c1e570) offloads every layer to pyggml's RPC server
(`--rpc 127.0.0.1:PORT -ngl 99`) and writes the same greedy text as llama.cpp alone, flash attention on and
off, on the built-in model and on SmolLM2 (Q4_1, f16 KV cache).

SmolLM2 only agrees because the server's CPU backend computes ggml's bits: a quantized model grows any
last-bit difference (a Q8_1 activation quant flips, the logits move by ~0.5) until a near-tie goes the other
way. So the server's kernels take ggml's x86 code paths (`pyggml.backends.cpu.numerics`, "x86" on these
machines): the Q8_0/Q8_1 activation rounding and the dot products' float order, ggml_v_expf in SOFT_MAX and
SwiGLU, libm's cosf/sinf/expf, the rope rotation's FMAs, RMS_NORM's double sum, and flash attention's
row-by-row online softmax with its f16 V accumulator. Every step's logits are then llama.cpp's bit for bit
(checked with an eval-callback probe); with "ref" numerics the server's text leaves llama.cpp's at the 4th of
these 16 tokens, flash attention on and off (llama.cpp's top-2 margin there: 0.018 and 0.025)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyggml.backends.cpu import cpu_init
from pyggml.backends.cpu.numerics import host_numerics
from pyggml.backends.rpc.server import RpcServer
from pyggml.models.builtin import builtin_model_path

PROMPT = "The module"
N_PREDICT = 16
TIMEOUT = 300
# llama-completion's text goes through a log thread that is not joined at exit: a run that printed its
# final timings printed everything (see tests/interop/test_llamacpp_builtin.py)
COMPLETION_DONE = re.compile(rb"common_perf_print: +total time")
ATTEMPTS = 10


@pytest.fixture(scope="module")
def server() -> Iterator[RpcServer]:
    with RpcServer([cpu_init(2)], "127.0.0.1", 0).start() as s:
        yield s


@pytest.fixture(scope="module")
def x86_server() -> Iterator[RpcServer]:
    """A server computing with ggml's x86 numerics, named: the code paths llama.cpp's own CPU takes on this
    host (its tools are built with -march=native; the server's default here too)."""
    if host_numerics() != "x86":
        pytest.skip("llama.cpp alone takes ggml's AVX2/AVX512 code paths only on x86 CPUs with AVX2 and FMA")
    with RpcServer([cpu_init(2, numerics="x86")], "127.0.0.1", 0).start() as s:
        yield s


def completion(tool: Path, model: Path, flash_attn: str, rpc: str | None, kv_type: str = "f16") -> bytes:
    cmd = [str(tool), "-m", str(model), "-p", PROMPT, "-n", str(N_PREDICT), "--temp", "0", "--repeat-penalty", "1.0",
           "-c", "256", "-no-cnv", "--no-display-prompt", "--no-warmup", "-t", "2", "--seed", "0", "-fa", flash_attn,
           "-ctk", kv_type, "-ctv", kv_type]
    if rpc is not None:
        cmd += ["--rpc", rpc, "-ngl", "99"]
    for _ in range(ATTEMPTS):
        r = subprocess.run(cmd, capture_output=True, timeout=TIMEOUT)
        assert r.returncode == 0, r.stderr.decode(errors="replace")[-3000:]
        if COMPLETION_DONE.search(r.stderr):
            assert r.stdout.endswith(b"\n\n"), r.stdout[-80:]
            return r.stdout[:-2]
    pytest.fail(f"llama-completion never printed all of its output in {ATTEMPTS} runs: {cmd}")


# q8_0: llama.cpp rotates K and V by Hadamard products hinted SRC0_IS_HADAMARD, which the server computes as
# ggml's CPU does
@pytest.mark.parametrize(("flash_attn", "kv_type"), [("off", "f16"), ("on", "f16"), ("on", "q8_0")])
def test_llamacpp_offloads_the_builtin_model_to_pyggml(completion_tool: Path, server: RpcServer,
                                                        flash_attn: str, kv_type: str) -> None:
    model = builtin_model_path()
    before = server.counts.copy()
    remote = completion(completion_tool, model, flash_attn, server.endpoint, kv_type)
    served = server.counts - before
    assert served["ALLOC_BUFFER"] >= 2 and served["SET_TENSOR"] > 20  # weights, KV cache and compute buffer
    assert served["GRAPH_COMPUTE"] >= 1 and served["GRAPH_RECOMPUTE"] >= N_PREDICT // 2  # decode reuses the graph
    assert remote, "llama.cpp generated nothing"
    assert remote == completion(completion_tool, model, flash_attn, None, kv_type)


@pytest.mark.parametrize("flash_attn", ["off", "on"])
def test_llamacpp_offloads_smollm2_to_pyggml(completion_tool: Path, x86_server: RpcServer, smollm2_path: Path,
                                            flash_attn: str) -> None:
    before = x86_server.counts.copy()
    remote = completion(completion_tool, smollm2_path, flash_attn, x86_server.endpoint)
    served = x86_server.counts - before
    assert served["INIT_TENSOR"] > 0  # Q4_1 rows of 576: llama.cpp asks the server to initialize them
    assert served["GRAPH_RECOMPUTE"] >= N_PREDICT // 2
    assert remote, "llama.cpp generated nothing"
    assert remote == completion(completion_tool, smollm2_path, flash_attn, None)


@pytest.mark.parametrize("flash_attn", ["off", "on"])
def test_llamacpp_offloads_to_a_server_lacking_ops(completion_tool: Path, flash_attn: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """The served backend lacks SET_ROWS (the KV cache's writes) and SWIGLU: the server computes them on the host
    CPU, llama.cpp writes its own text, and the log names both ops once."""
    import logging

    from lacking import LackingCPU

    caplog.set_level(logging.WARNING, "pyggml.backends.rpc.server")
    model = builtin_model_path()
    with RpcServer([LackingCPU(["SET_ROWS", "SWIGLU"], 2)], "127.0.0.1", 0).start() as server:
        remote = completion(completion_tool, model, flash_attn, server.endpoint)
    assert server.fell_back == {"SET_ROWS", "SWIGLU"}
    lines = [r.getMessage() for r in caplog.records if "does not compute op" in r.getMessage()]
    assert sorted(line.split(" op ")[1].split()[0] for line in lines) == ["SET_ROWS", "SWIGLU"]
    assert remote, "llama.cpp generated nothing"
    assert remote == completion(completion_tool, model, flash_attn, None)
