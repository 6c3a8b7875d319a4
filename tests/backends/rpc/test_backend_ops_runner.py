"""pyggml.testing.backend_ops_suite without llama.cpp: its parser on test-backend-ops' console output, and its
runner on a fake test-backend-ops and a fake RPC server (scripts written here), so the restarts, time limits and
verdicts are checked in seconds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pyggml.testing import backend_ops_suite as suite

OUTPUT = """Testing 2 devices

Backend 1/2: CPU
  Skipping
Backend 2/2: RPC0
  Device description: 127.0.0.1:5000
  SUM(type=f32,ne=[10,5,4,3]): \x1b[1;32mOK\x1b[0m
  SUM(type=f32,ne=[33,256,1,1],permute=[1,0,2,3]): [SUM] NMSE = 0.014 > 0.0000001 \x1b[1;31mFAIL\x1b[0m
  CONV_2D(ne_input=[1,1,1,2],cwhn=1): not supported [CPU]
  MUL_MAT(type_a=f16,m=16416,n=1): skipping large tensors for speed \n  2/3 tests passed
  Backend RPC0: \x1b[1;31mFAIL\x1b[0m
"""


def test_parse_cases_reads_every_verdict() -> None:
    assert suite.parse_cases(OUTPUT) == {
        "SUM(type=f32,ne=[10,5,4,3])": suite.OK,
        "SUM(type=f32,ne=[33,256,1,1],permute=[1,0,2,3])": suite.FAIL,
        "CONV_2D(ne_input=[1,1,1,2],cwhn=1)": suite.NOT_SUPPORTED,
        "MUL_MAT(type_a=f16,m=16416,n=1)": suite.SKIPPED,
    }


FAKE_SERVER = """\
import socket, sys
port = int(sys.argv[sys.argv.index("-p") + 1])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen()
while True:
    conn, _ = s.accept()
    if conn.recv(16) == b"die":
        sys.exit(1)
    conn.close()
"""

FAKE_TEST_BACKEND_OPS = """\
import os, socket, sys, time
OPS = ["BAD", "DIE", "GOOD", "SLOW"]
if sys.argv[1:] == ["--list-ops"]:
    print("GGML operations:")
    for op in OPS:
        print("  " + op)
    print("\\nTotal: %d operations" % len(OPS))
    sys.exit(0)
assert sys.argv[1:4] == ["test", "-b", "RPC0"], sys.argv
op = sys.argv[5]
host, port = os.environ["PYGGML_RPC_SERVERS"].split(":")
conn = socket.create_connection((host, int(port)))  # refused if the server is gone
print("  %s(v=0): \\x1b[1;32mOK\\x1b[0m" % op, flush=True)
if op == "DIE":
    conn.sendall(b"die")
    print("RPC: remote_graph_compute failed", flush=True)
    os.abort()
if op == "SLOW":
    time.sleep(60)
verdict = "FAIL" if op == "BAD" else "OK"
print("  %s(v=1): %s" % (op, verdict))
print("  %d/2 tests passed" % (1 if op == "BAD" else 2))
"""


@pytest.fixture
def fakes(tmp_path: Path) -> tuple[Path, Path]:
    """(test-backend-ops, ggml-rpc-server): Python scripts standing in for them."""
    paths = []
    for name, text in (("test-backend-ops", FAKE_TEST_BACKEND_OPS), ("ggml-rpc-server", FAKE_SERVER)):
        p = tmp_path / name
        p.write_text(f"#!{sys.executable}\n{text}")
        p.chmod(0o755)
        paths.append(p)
    return paths[0], paths[1]


def test_the_runner_restarts_a_server_a_run_ended_and_stops_a_run_at_its_time_limit(fakes: tuple[Path, Path]) -> None:
    binary, server = fakes
    assert suite.list_ops(binary) == ["BAD", "DIE", "GOOD", "SLOW"]
    with suite.RPCServer("ggml", ggml_rpc_server=server) as rpc:
        runs = {op: suite.run_op(binary, rpc, op, timeout=3.0) for op in ("GOOD", "DIE", "GOOD", "SLOW", "BAD")}
        assert rpc.starts == 2  # DIE ended the first server; the next GOOD started another
    good, die, slow, bad = runs["GOOD"], runs["DIE"], runs["SLOW"], runs["BAD"]
    assert good.ok and good.verdicts == {"GOOD(v=0)": suite.OK, "GOOD(v=1)": suite.OK}
    assert not die.finished and die.passed == 1 and "remote_graph_compute failed" in die.detail
    assert "the server (exited)" in die.detail
    assert not slow.finished and "killed after 3 s" in slow.detail and slow.verdicts == {"SLOW(v=0)": suite.OK}
    assert bad.finished and not bad.ok and bad.failed == ["BAD(v=1)"]


def test_run_suite_and_its_table(fakes: tuple[Path, Path]) -> None:
    binary, server = fakes
    result = suite.run_suite(binary, ["ggml"], ["GOOD", "DIE", "BAD"], timeout=10.0, jobs=2, ggml_rpc_server=server)
    assert [r.op for r in result.runs["ggml"]] == ["GOOD", "DIE", "BAD"]
    table = suite.format_table(result)
    assert "| GOOD | 2 | 2 | 0 |" in table and "| DIE | 1 ! | 1 | 0 |" in table and "| BAD | 2 | 1 | 1 |" in table
    assert "ggml: 3 ops, 1 pass every case; 5 cases, 4 passed, 1 failed; 1 runs did not finish" in table
    with pytest.raises(ValueError, match="jobs"):
        suite.run_suite(binary, ["ggml"], ["GOOD"], jobs=0, ggml_rpc_server=server)
    with pytest.raises(ValueError, match="unknown RPC server"):
        suite.RPCServer("llama")
