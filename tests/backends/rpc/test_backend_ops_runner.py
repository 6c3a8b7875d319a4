"""pyggml.testing.backend_ops_suite: its parser on test-backend-ops' console output, and its runner on a fake
test-backend-ops and a fake RPC server (scripts written here), so the restarts, time limits, resumes after a
refusal and verdicts are checked in seconds; then the resumes through a real server whose torch backend lacks an
op for one type on purpose, with llama.cpp's test-backend-ops (interop)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pyggml.testing import backend_ops_suite as suite
from pyggml.testing import llamacpp

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
    said = conn.recv(16)
    if said == b"die":
        sys.exit(1)
    if said.startswith(b"refuse "):
        print("rpc-server: client 1: GRAPH_COMPUTE on 'Fake': graph_plan_create: backend 'Fake' does not support "
              "op %s of node 0 'x' (F32[1]; sources none); closing the connection" % said[7:].decode(), flush=True)
    conn.close()
"""

FAKE_TEST_BACKEND_OPS = """\
import os, re, socket, sys, time
OPS = ["ABORT", "BAD", "DIE", "GOOD", "MIXED", "SLOW", "TWICE"]
if sys.argv[1:] == ["--list-ops"]:
    print("GGML operations:")
    for op in OPS:
        print("  " + op)
    print("\\nTotal: %d operations" % len(OPS))
    sys.exit(0)
op = sys.argv[5]
params = sys.argv[7] if sys.argv[6:7] == ["-p"] else ""
skip = int(os.environ["PYGGML_SKIP_CASES"])
values = {"MIXED": [0, 1, 2, 3, 4], "TWICE": [0, 1, 0, 1]}.get(op, [0, 1])  # TWICE lists its cases twice
cases = [i for i in values if re.search(params, "v=%d" % i)]
if os.environ.get("PYGGML_LIST_CASES"):  # the patch's list mode
    assert sys.argv[1:4] == ["test", "-b", "CPU"], sys.argv
    for n, i in enumerate(cases):
        print("  pyggml case %d: %s(v=%d)" % (n, op, i))
    sys.exit(0)
assert sys.argv[1:4] == ["test", "-b", "RPC0"], sys.argv
host, port = os.environ["PYGGML_RPC_SERVERS"].split(":")
conn = socket.create_connection((host, int(port)))  # refused if the server is gone
if op in ("MIXED", "TWICE"):  # MIXED: cases 1 and 2 refused (the server says so); TWICE: its second refused, its
    for n, i in enumerate(cases[skip:], skip):  # first failed; the others pass
        print("  pyggml case %d: %s(v=%d)" % (n, op, i), flush=True)
        if (i in (1, 2)) if op == "MIXED" else n == 1:
            conn.sendall(b"refuse " + op.encode())
            time.sleep(0.2)
            print("RPC: remote_graph_compute failed", flush=True)
            os.abort()
        verdict = "FAIL" if op == "TWICE" and n == 0 else "\\x1b[1;32mOK\\x1b[0m"
        print("  %s(v=%d): %s" % (op, i, verdict), flush=True)
    print("  %d/%d tests passed" % (len(cases) - skip, len(cases) - skip))
    sys.exit(0)
print("  pyggml case 0: %s(v=0)" % op, flush=True)
if op == "ABORT":  # the client aborts, the server says nothing of a refusal
    os.abort()
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
    assert suite.list_ops(binary) == ["ABORT", "BAD", "DIE", "GOOD", "MIXED", "SLOW", "TWICE"]
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
    assert "| GOOD | 2 | 2 | 2 | 0 | 0 | 0 |" in table and "| DIE | 1 ! | 1 | 1 | 0 | 0 | 0 |" in table
    assert "| BAD | 2 | 2 | 1 | 1 | 0 | 0 |" in table
    assert ("ggml: 3 ops, 1 pass every case; 5 cases, 5 claimed, 4 passed, 0 unclaimed, 0 not run, 1 failed; 1 runs "
            "did not finish") in table
    with pytest.raises(ValueError, match="jobs"):
        suite.run_suite(binary, ["ggml"], ["GOOD"], jobs=0, ggml_rpc_server=server)
    with pytest.raises(ValueError, match="unknown RPC server"):
        suite.RPCServer("llama")


def test_a_refused_case_is_unclaimed_and_the_run_resumes_after_it(fakes: tuple[Path, Path]) -> None:
    binary, server = fakes
    assert suite.list_cases(binary, "MIXED") == [f"MIXED(v={i})" for i in range(5)]
    with suite.RPCServer("ggml", ggml_rpc_server=server) as rpc:
        mixed = suite.run_op(binary, rpc, "MIXED", timeout=30.0)
        cut = suite.run_op(binary, rpc, "MIXED", timeout=30.0, max_refusals=2)
        chosen = suite.run_op(binary, rpc, "MIXED", timeout=30.0, params="v=[24]")
        aborted = suite.run_op(binary, rpc, "ABORT", timeout=30.0)
        assert rpc.starts == 1  # a refusal leaves the server running
    assert mixed.finished and mixed.ok and mixed.verdicts == {
        "MIXED(v=0)": suite.OK, "MIXED(v=1)": suite.UNCLAIMED, "MIXED(v=2)": suite.UNCLAIMED,
        "MIXED(v=3)": suite.OK, "MIXED(v=4)": suite.OK}
    assert mixed.refusals == {"MIXED(v=1)": "MIXED", "MIXED(v=2)": "MIXED"}
    assert (mixed.cases, mixed.claimed, mixed.passed) == (5, 3, 3)
    # two refusals in a row: the later cases are left out, and said to be
    assert cut.verdicts["MIXED(v=3)"] == cut.verdicts["MIXED(v=4)"] == suite.NOT_RUN
    assert (cut.claimed, cut.count(suite.UNCLAIMED), cut.count(suite.NOT_RUN)) == (1, 2, 2)
    # -p: the cases it does not find are not run; the refused one among those it finds is unclaimed
    assert chosen.finished and chosen.verdicts == {
        "MIXED(v=2)": suite.UNCLAIMED, "MIXED(v=4)": suite.OK, "MIXED(v=0)": suite.NOT_RUN,
        "MIXED(v=1)": suite.NOT_RUN, "MIXED(v=3)": suite.NOT_RUN}
    # an abort the server did not ask for is not a refusal: the op's run ends there, unfinished
    assert not aborted.finished and aborted.verdicts == {} and "exit status" in aborted.detail
    with pytest.raises(ValueError, match="max_refusals"):
        suite.run_op(binary, rpc, "MIXED", max_refusals=0)


def test_a_case_listed_twice_has_a_verdict_each_time(fakes: tuple[Path, Path]) -> None:
    """TWICE lists v=0 and v=1 twice: the first v=0 fails, the first v=1 is refused, the repeats pass. Each is
    counted, across the resume after the refusal too (a repeat's pass never hides the first one's failure)."""
    binary, server = fakes
    assert suite.numbered(suite.list_cases(binary, "TWICE")) == ["TWICE(v=0)", "TWICE(v=1)", "TWICE(v=0) #2",
                                                                 "TWICE(v=1) #2"]
    with suite.RPCServer("ggml", ggml_rpc_server=server) as rpc:
        twice = suite.run_op(binary, rpc, "TWICE", timeout=30.0)
        chosen = suite.run_op(binary, rpc, "TWICE", timeout=30.0, params="v=1")
    assert twice.finished and twice.verdicts == {"TWICE(v=0)": suite.FAIL, "TWICE(v=1)": suite.UNCLAIMED,
                                                 "TWICE(v=0) #2": suite.OK, "TWICE(v=1) #2": suite.OK}
    assert twice.failed == ["TWICE(v=0)"] and twice.refusals == {"TWICE(v=1)": "TWICE"}
    assert (twice.cases, twice.claimed, twice.passed) == (4, 3, 2)
    # -p finds both v=1: the first (case 0 of the filtered list) fails, the second is refused; both v=0 are not run
    assert chosen.verdicts == {"TWICE(v=1)": suite.FAIL, "TWICE(v=1) #2": suite.UNCLAIMED,
                               "TWICE(v=0)": suite.NOT_RUN, "TWICE(v=0) #2": suite.NOT_RUN}
    assert suite.parse_cases("  A(x=1): OK\n  A(x=1): FAIL\n") == {"A(x=1)": suite.OK, "A(x=1) #2": suite.FAIL}


LACKING_SERVER = """\
import logging, sys
sys.path.insert(0, {tests!r})
from lacking import lacking_torch
from pyggml.backends.rpc.server import RpcServer
from pyggml.core.types import GGMLType
logging.basicConfig(stream=sys.stderr, level=logging.INFO)
port = int(sys.argv[sys.argv.index("-p") + 1])
RpcServer([lacking_torch(["RELU"], [GGMLType.F16])], "127.0.0.1", port, idle_timeout=None,
          fallback=False).serve_forever()
"""


@pytest.mark.interop
def test_a_real_server_refuses_the_cases_its_backend_lacks_and_the_later_ones_run(tmp_path: Path) -> None:
    """RELU's 12 cases (f16, f32, bf16 in that order) through a torch backend lacking RELU of F16 only, without
    fallback: the f16 cases are refused one by one, each the end of a test-backend-ops process, and every
    f32 and bf16 case after them runs and passes."""
    pytest.importorskip("torch")
    try:
        binary = llamacpp.require_tool("test-backend-ops")
    except llamacpp.NoCompilerError as e:
        pytest.skip(str(e))
    script = tmp_path / "lacking-rpc-server"
    script.write_text(f"#!{sys.executable}\n" + LACKING_SERVER.format(tests=str(Path(__file__).parent)))
    script.chmod(0o755)
    cases = suite.list_cases(binary, "RELU")
    assert len(cases) == 12 and sum("type=f16" in c for c in cases) == 4
    with suite.RPCServer("ggml", ggml_rpc_server=script) as rpc:
        run = suite.run_op(binary, rpc, "RELU", timeout=300.0)
        assert rpc.starts == 1, rpc.log_tail()
    assert run.finished and run.ok, run.detail
    assert run.verdicts == {c: suite.UNCLAIMED if "type=f16" in c else suite.OK for c in cases}
    assert set(run.refusals.values()) == {"RELU"}
