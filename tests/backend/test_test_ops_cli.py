"""`pyggml test-ops`: the table, its verdicts and its exit code."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml.backend import register_backend, tensor_get_numpy, tensor_set_numpy, unregister_backend
from pyggml.backends.cpu import CPUBackend
from pyggml.cli.main import main
from pyggml.core.graph import Graph
from pyggml.core.tensor import Tensor, UnaryOp
from pyggml.core.types import GGMLType
from pyggml.testing import test_ops
from pyggml.testing.test_ops import MAX_NMSE, OpCase, compare, new, op, run_case

# the ops of issue 2 (the core), by the label test-ops shows (ggml's op desc: UNARY shows its function)
ISSUE_2_OPS = [
    "DUP", "ADD", "ADD1", "ACC", "SUB", "MUL", "DIV", "SQR", "SQRT", "LOG", "SUM", "SUM_ROWS", "MEAN", "ARGMAX",
    "REPEAT", "CONCAT", "NORM", "RMS_NORM", "GROUP_NORM", "MUL_MAT", "OUT_PROD", "SCALE", "SET", "CPY", "CONT",
    "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "GET_ROWS", "DIAG", "DIAG_MASK_INF", "DIAG_MASK_ZERO", "SOFT_MAX",
    "ROPE", "ALIBI", "CLAMP", "CONV_1D", "CONV_2D", "CONV_TRANSPOSE_1D", "POOL_1D", "POOL_2D", "UPSCALE", "PAD",
    "ARGSORT", "TOP_K", "LEAKY_RELU", "MAP_CUSTOM1", "MAP_CUSTOM2", "MAP_CUSTOM3",
] + [u.name for u in UnaryOp]


class WrongBackend(CPUBackend):
    """Computes like the CPU, then nudges every graph's last node: its results must be caught."""

    def _get_name(self) -> str:
        return "Wrong"

    def _graph_compute(self, graph: Graph) -> None:
        super()._graph_compute(graph)
        out = graph.nodes[-1]
        tensor_set_numpy(out, tensor_get_numpy(out).astype(np.float32) * 1.01)


class NothingBackend(CPUBackend):
    def _get_name(self) -> str:
        return "Nothing"

    def _supports_op(self, op: Tensor) -> bool:
        return False


@pytest.fixture
def fake_backends() -> object:
    register_backend("wrong", lambda: WrongBackend())
    register_backend("nothing", lambda: NothingBackend())
    yield
    unregister_backend("wrong")
    unregister_backend("nothing")


def table_lines(text: str, label: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip().startswith(label + " ")]


def test_cases_cover_every_op_of_the_core() -> None:
    labels = {c.label for c in test_ops.all_cases()}
    assert set(ISSUE_2_OPS) <= labels, sorted(set(ISSUE_2_OPS) - labels)
    descs = [c.desc for c in test_ops.all_cases()]
    assert any("permuted" in d for d in descs) and any("transposed" in d for d in descs)
    assert any("nr=[2,2,2,2]" in d for d in descs)  # broadcast


def test_add_on_cpu_runs_clean(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["test-ops", "-b", "cpu", "-o", "ADD"]) == 0
    out = capsys.readouterr().out
    lines = table_lines(out, "ADD")
    assert len(lines) >= 20
    assert all(line.endswith("OK") for line in lines), [x for x in lines if not x.endswith("OK")]
    assert "0 failed" in out


def test_wrong_results_fail_and_exit_non_zero(capsys: pytest.CaptureFixture[str], fake_backends: object) -> None:
    assert main(["test-ops", "-b", "wrong", "-o", "MUL"]) == 1
    out = capsys.readouterr().out
    lines = table_lines(out, "MUL")
    assert lines and all("FAIL" in line and "NMSE" in line for line in lines)
    assert "Testing backend Wrong against CPU" in out


def test_unsupported_ops_are_listed_not_failed(capsys: pytest.CaptureFixture[str], fake_backends: object) -> None:
    assert main(["test-ops", "-b", "nothing", "-o", "SCALE"]) == 0
    lines = table_lines(capsys.readouterr().out, "SCALE")
    assert lines and all(line.endswith("not supported") for line in lines)


def test_unknown_backend_and_op(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["test-ops", "-b", "vulkan"]) == 2
    assert "no backend named 'vulkan'" in capsys.readouterr().err
    assert main(["test-ops", "-o", "NO_SUCH_OP"]) == 1
    assert "no test case for op 'NO_SUCH_OP'" in capsys.readouterr().out


def test_a_missing_builder_is_not_supported_and_a_broken_one_fails() -> None:
    from pyggml.backends.cpu import cpu_init

    missing = OpCase("X", "missing", lambda ctx: op(ctx, "no_such_builder")(new(ctx, "a", GGMLType.F32, [4])))
    r = run_case(missing, cpu_init(), cpu_init())
    assert r.status == "not supported" and "no_such_builder" in r.detail

    def broken(ctx: object) -> Tensor:
        raise ValueError("bad shape rule")

    r = run_case(OpCase("X", "broken", broken), cpu_init(), cpu_init())  # type: ignore[arg-type]
    assert r.status == "FAIL" and "bad shape rule" in r.detail


def test_compare_follows_ggml() -> None:
    a = np.array([1.0, 2.0, -3.0])
    assert compare(a, a) == (0.0, "")
    nmse, why = compare(a, np.array([1.0, 2.0, -3.3]))
    assert why == "" and nmse == pytest.approx(0.09 / 14)
    assert compare(a, np.array([1.0, np.nan, 0.0]))[1].startswith("NaN at index 1")
    inf = np.array([1.0, -np.inf, 2.0])
    assert compare(inf, inf.copy()) == (0.0, "")  # same infinities: left out
    assert "inf mismatch at index 1" in compare(inf, np.array([1.0, np.inf, 2.0]))[1]
    assert "inf mismatch" in compare(inf, np.array([1.0, 5.0, 2.0]))[1]
    assert compare(np.zeros(3), np.zeros(3)) == (0.0, "")
    assert MAX_NMSE == 1e-7 and test_ops.MAX_NMSE_MUL_MAT == 5e-4 and test_ops.MAX_NMSE_ROPE == 1e-3


def test_the_whole_table_runs_clean_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["test-ops", "-b", "cpu"]) == 0
    out = capsys.readouterr().out
    assert " FAIL" not in out
    assert " 0 failed" in out

