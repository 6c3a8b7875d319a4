"""The CPU kernels' fuzz, short: 2,000 random graphs over every op the CPU backend has a kernel for (shapes,
strides, sources, types and op_params mutated from the op checker's nodes), computed in worker processes
between guard bytes. None may crash its worker, hang, raise anything but a GGMLError, write outside its
destination or read outside its tensors (see `pyggml.testing.op_fuzz`). The seed is fixed, so CI computes the
same graphs every time; `python benchmarks/fuzz_ops.py` runs the long fuzz.
"""

from __future__ import annotations

import io

import pytest

from pyggml.core.tensor import GGMLOp, is_view_op
from pyggml.testing.op_fuzz import BATCH_INVARIANT_ENV, USER_FUNCTION_OPS, run_fuzz

SEED = 39
GRAPHS = 2000
# far beyond a graph's compute (milliseconds); a first use's numba compile stays well within it
GRAPH_TIMEOUT = 120.0


@pytest.mark.slow
def test_fuzz_finds_nothing_over_every_op() -> None:
    from pyggml.backends.cpu.kernels import KERNELS

    summary = run_fuzz(SEED, GRAPHS, jobs=2, timeout=GRAPH_TIMEOUT)
    report = io.StringIO()
    summary.report(report)
    assert summary.graphs == GRAPHS, report.getvalue()
    assert not summary.findings, report.getvalue()
    ops = {op.name for op in KERNELS if op != GGMLOp.NONE and not is_view_op(op) and op not in USER_FUNCTION_OPS}
    assert set(summary.graphs_by_op) == ops, report.getvalue()
    # most ops' kernels ran (not only refused): a few rare ones may go without in 2,000 graphs
    assert len([op for op in ops if summary.computed_by_op[op]]) >= len(ops) - 3, report.getvalue()
    assert summary.statuses["computed"] > GRAPHS // 3, report.getvalue()


@pytest.mark.slow
def test_fuzz_finds_nothing_on_batch_invariant_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """pyggml serve's kernels (MUL_MAT's direct loops at every width, the flash-attention row walk) too."""
    monkeypatch.setenv(BATCH_INVARIANT_ENV, "1")  # the workers inherit it
    summary = run_fuzz(SEED + 1, GRAPHS // 4, jobs=2, timeout=GRAPH_TIMEOUT)
    report = io.StringIO()
    summary.report(report)
    assert summary.graphs == GRAPHS // 4 and not summary.findings, report.getvalue()
    assert summary.computed_by_op["MUL_MAT"] and summary.computed_by_op["FLASH_ATTN_EXT"], report.getvalue()
