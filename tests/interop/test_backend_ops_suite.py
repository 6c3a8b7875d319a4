"""llama.cpp's own op suite through `pyggml rpc-server` (issue 44): test-backend-ops (0c1e570), op by op on an RPC
device, each case compared with llama.cpp's CPU backend, for every op of its --list-ops.

Every case that llama.cpp's CPU computes must pass through pyggml's server: the run of each op finishes and each
of its cases is OK (or "not supported", which only the CPU says: ggml's RPC client claims every op). That holds
every case ggml-rpc-server passes, which passes them all (`python -m pyggml.testing.backend_ops_suite` prints both
servers' tables), without running the suite a second time through it.

The server runs every op once per module (`pyggml.testing.backend_ops_suite`, one process per op with a time
limit); each op is then a test of its own. The ops pyggml cannot compute yet are KNOWN_GAPS, each with its reason,
expected to fail (strict): an op that starts passing fails here until its row is removed.
"""

from __future__ import annotations

import pytest

from pyggml.core.tensor import GGMLOp, GLUOp, UnaryOp
from pyggml.testing import backend_ops_suite as suite
from pyggml.testing import llamacpp

# ggml's ops, unary ops and GLU ops by name: what `test-backend-ops --list-ops` lists (checked below)
OPS = sorted({op.name for op in GGMLOp if op != GGMLOp.NONE} | {u.name for u in UnaryOp} | {g.name for g in GLUOp})

# seconds an op's cases may take
OP_TIMEOUT = 1800.0

KNOWN_GAPS: dict[str, str] = {}


@pytest.fixture(scope="module")
def runs() -> dict[str, suite.OpRun]:
    """op -> its run through pyggml rpc-server, every op of OPS."""
    try:
        binary = llamacpp.require_tool("test-backend-ops")
    except llamacpp.NoCompilerError as e:
        pytest.skip(str(e))  # the one reason to skip: no compiler to build llama.cpp with
    result = suite.run_suite(binary, ["pyggml"], OPS, timeout=OP_TIMEOUT)
    print(suite.format_table(result))  # shown with -s or -rP: the table and its time
    return {r.op: r for r in result.runs["pyggml"]}


def test_the_ops_are_those_of_list_ops() -> None:
    try:
        binary = llamacpp.require_tool("test-backend-ops")
    except llamacpp.NoCompilerError as e:
        pytest.skip(str(e))
    assert suite.list_ops(binary) == OPS


def test_known_gaps_are_ops() -> None:
    assert set(KNOWN_GAPS) <= set(OPS)


@pytest.mark.slow
@pytest.mark.parametrize("op", [pytest.param(op, marks=pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[op]))
                                if op in KNOWN_GAPS else op for op in OPS])
def test_every_case_llamacpps_cpu_computes_passes_through_pyggml(op: str, runs: dict[str, suite.OpRun]) -> None:
    run = runs[op]
    assert run.finished, f"{op}: the run ended after {run.cases} cases ({run.passed} passed): {run.detail}"
    assert not run.failed, f"{op}: {len(run.failed)} of {run.cases} cases fail: {run.failed[:5]}"
