"""CPU kernels that cannot leave their tensors: a node whose op_params, shapes or strides would take its kernel
outside its tensors' bytes is refused, when its plan is made, with a GGMLError naming the node, its op and the
numbers, before any byte is read or written; the backend computes the next graph as before.

The nodes are made as the RPC server makes a client's (tensors by address in one buffer, the buffer inside a
larger host array of guard bytes: `op_fuzz.Runner`), so a read outside would show as bytes of the host array
in the result and a write outside as a changed guard byte. The three convolutions of issue 39 crashed the
process or returned heap bytes: they run in a child process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pyggml.backends.cpu.kernels import ComputeParams
from pyggml.backends.cpu.kernels._common import strided_view
from pyggml.backends.cpu.kernels.vec_dot.type_table import QUANT_MUL_MAT_TYPES
from pyggml.backends.cpu.plan import plan_compute, plan_create
from pyggml.core.errors import (
    ArgumentError,
    GGMLError,
    LayoutError,
    OutOfBoundsError,
    OutOfMemoryError,
    ShapeError,
)
from pyggml.core.graph import Graph
from pyggml.core.tensor import GGMLOp, default_strides
from pyggml.core.types import GGMLType
from pyggml.testing.op_fuzz import GraphSpec, Runner, TensorSpec

F32, F16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.I32
NAN_BITS = 0x7FC00000


def tensor(type: GGMLType, ne: list[int], root: int, nb: list[int] | None = None, fill: str = "values") -> TensorSpec:
    return TensorSpec(int(type), list(ne), nb if nb is not None else default_strides(type, ne), root, 0, fill)


def node(op: GGMLOp, dst: TensorSpec, params: list[int], *srcs: TensorSpec | None) -> GraphSpec:
    words = (list(params) + [0] * 16)[:16]
    return GraphSpec(seed=39, index=0, op=int(op), node=dst, params=words, srcs=[*srcs, *[None] * (10 - len(srcs))])


@pytest.fixture(scope="module")
def runner() -> Runner:
    return Runner()


def refused(runner: Runner, spec: GraphSpec, cls: type[GGMLError], *fragments: str,
            values: dict[int, np.ndarray] | None = None) -> None:
    """The node's CPU plan (or its compute) raises `cls` naming every fragment, and no byte of the host array
    changed; `values` sets sources' elements (by source index, C order) before."""
    with runner.placed(spec) as p:
        np.copyto(p.arena, p.patterns[0])
        np.copyto(p.arena, p.data, where=~p.guard)
        for i, v in (values or {}).items():
            src = p.node.src[i]
            assert src is not None and src.data is not None
            off = src.data - p.arena.ctypes.data
            p.arena[off: off + v.nbytes] = v.view(np.uint8).reshape(-1)
        before = p.arena.copy()
        graph = Graph(1)
        graph.nodes = [p.node]
        with pytest.raises(cls) as info:  # the CPU plan itself (the backend asks supports_op first)
            plan_compute(plan_create(graph, ComputeParams()))
        for fragment in fragments:
            assert fragment in str(info.value), f"{str(info.value)!r} does not name {fragment!r}"
        assert np.array_equal(p.arena, before), "a refused node changed bytes"
    still_adds(runner)


def still_adds(runner: Runner) -> None:
    """The backend computes a good node after a refusal, within its bytes."""
    good = node(GGMLOp.ADD, tensor(F32, [8, 3, 1, 1], 0), [], tensor(F32, [8, 3, 1, 1], 1),
                tensor(F32, [8, 1, 1, 1], 2))
    assert runner.run(good).status == "computed"
    with runner.placed(good) as p:
        np.copyto(p.arena, p.data)
        graph = Graph(1)
        graph.nodes = [p.node]
        runner.backend.graph_compute(graph)
        a, b, d = (p.node.src[0], p.node.src[1], p.node)
        base = p.arena.ctypes.data

        def values(t: object, n: int) -> np.ndarray:
            off = t.data - base  # type: ignore[attr-defined]
            return p.arena[off: off + 4 * n].view(np.float32)

        assert np.array_equal(values(d, 24), (values(a, 24).reshape(3, 8) + values(b, 8)).reshape(-1))


# --- issue 39's three convolutions, in a child process (they crashed it or read its heap) ---

_CONV_CASES = r"""
import json
from pyggml.core.graph import Graph
from pyggml.core.tensor import GGMLOp
from pyggml.core.types import GGMLType
from pyggml.testing.op_fuzz import GraphSpec, Runner, TensorSpec
from pyggml.core.tensor import default_strides

F32 = GGMLType.F32


def t(ne, root):
    return TensorSpec(int(F32), ne, default_strides(F32, ne), root)


def case(op, dst, params, kernel, image):
    return GraphSpec(39, 0, int(op), dst, (params + [0] * 16)[:16], [kernel, image] + [None] * 8)


cases = {
    # 256 input floats, 64 dst floats: a stride of 16 read 192-480 bytes past the input
    "dw_stride_16": case(GGMLOp.CONV_2D_DW, t([8, 8, 1, 1], 0), [16, 1, 0, 0, 1, 1], t([1, 1, 1, 1], 1),
                         t([16, 16, 1, 1], 2)),
    # a stride of -1 and a NaN's bits as the other stride: SIGSEGV
    "dw_nan_stride": case(GGMLOp.CONV_2D_DW, t([8, 8, 1, 1], 0), [-1, 0x7FC00000, 0, 0, 1, 1],
                          t([3, 3, 1, 1], 1), t([16, 16, 1, 1], 2)),
    # the float bits of -1.0 as a stride: SIGSEGV
    "conv_2d_negative_stride": case(GGMLOp.CONV_2D, t([8, 8, 2, 1], 0), [-1082130432, 1, 0, 0, 1, 1],
                                    t([3, 3, 1, 2], 1), t([10, 10, 1, 1], 2)),
}
runner = Runner()
out = {}
for name, spec in cases.items():
    with runner.placed(spec) as p:
        graph = Graph(1)
        graph.nodes = [p.node]
        try:
            plan = runner.backend.graph_plan_create(graph)
            runner.backend.graph_plan_compute(plan)
            out[name] = ["computed", ""]
        except Exception as e:
            out[name] = [type(e).__name__, str(e)]
    out[name].append(runner.run(spec).status)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def conv_outcomes() -> dict[str, list[str]]:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_CONV_CASES)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"the child ended with {done.returncode}: {done.stderr[-2000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_conv_2d_dw_stride_past_its_input_is_refused(conv_outcomes: dict[str, list[str]]) -> None:
    cls, message, status = conv_outcomes["dw_stride_16"]
    assert cls == ShapeError.__name__ and status == "refused"
    for fragment in ("CONV_2D_DW", "'dst'", "8 x 8", "strides (16, 1)", "gives 1 x 16"):
        assert fragment in message, message


def test_conv_2d_dw_negative_and_nan_strides_are_refused(conv_outcomes: dict[str, list[str]]) -> None:
    cls, message, status = conv_outcomes["dw_nan_stride"]
    assert cls == ArgumentError.__name__ and status == "refused"
    for fragment in ("CONV_2D_DW", "'dst'", f"strides (-1, {NAN_BITS})", ">= 1"):
        assert fragment in message, message


def test_conv_2d_negative_stride_is_refused(conv_outcomes: dict[str, list[str]]) -> None:
    cls, message, status = conv_outcomes["conv_2d_negative_stride"]
    assert cls == ArgumentError.__name__ and status == "refused"
    assert "CONV_2D" in message and "strides (-1082130432, 1)" in message, message


def test_conv_2d_dw_valid_node_computes_within_its_bytes(runner: Runner) -> None:
    """The shape rule's own node (stride 2, padding 1, dilation 1) computes, its result independent of the bytes
    around its tensors."""
    ok = node(GGMLOp.CONV_2D_DW, tensor(F32, [8, 8, 1, 1], 0), [2, 2, 1, 1, 1, 1], tensor(F32, [3, 3, 1, 1], 1),
              tensor(F32, [16, 16, 1, 1], 2))
    assert runner.run(ok).status == "computed"


# --- the shared view check ---


def test_a_view_past_its_array_is_refused() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    v = strided_view(a, (2, 2), (16, 4), "a window")
    assert np.array_equal(v, [[0, 1], [4, 5]])
    with pytest.raises(OutOfBoundsError) as info:
        strided_view(a, (3, 4), (32, 4), "a window")  # the third row starts at byte 64: past its 48 bytes
    for fragment in ("a window", "[3, 4]", "[32, 4]", "[0, 80)", "[0, 48)"):
        assert fragment in str(info.value)
    with pytest.raises(OutOfBoundsError):
        strided_view(a[1:], (2,), (-16,), "before")  # a negative stride reaching before the view's first row


# --- what the fuzz found in other kernels ---


def test_mul_mat_over_no_src0_matrices_is_refused(runner: Runner) -> None:
    """src0 with ne2 = 0 under an src1 of one matrix: the broadcast divided by zero."""
    spec = node(GGMLOp.MUL_MAT, tensor(F32, [4, 2, 1, 1], 0), [], tensor(F32, [8, 4, 0, 1], 1),
                tensor(F32, [8, 2, 1, 1], 2))
    refused(runner, spec, ShapeError, "MUL_MAT", "'dst'", "[8, 4, 0, 1]", "[8, 2, 1, 1]")


def test_quantized_rows_at_another_stride_are_refused(runner: Runner) -> None:
    """A Q8_0 tensor's nb[0] of 0: its bounds were checked as 0 bytes per row, its view read whole rows."""
    rows = TensorSpec(int(GGMLType.Q8_0), [32, 4, 1, 1], [0, 34, 136, 136], 1)
    spec = node(GGMLOp.GET_ROWS, tensor(F32, [32, 2, 1, 1], 0), [], rows, tensor(I32, [2, 1, 1, 1], 2))
    refused(runner, spec, LayoutError, "'src0'", "q8_0".upper(), "nb[0] = 0", "34")


def test_a_missing_source_is_refused(runner: Runner) -> None:
    """The kernels assumed their sources: an AssertionError before."""
    spec = node(GGMLOp.ADD, tensor(F32, [8, 2, 1, 1], 0), [], tensor(F32, [8, 2, 1, 1], 1), None)
    refused(runner, spec, ArgumentError, "'dst'", "ADD", "src[1]")
    with runner.placed(spec) as p:
        assert not runner.backend.supports_op(p.node)


def test_a_padding_of_two_billion_is_refused_before_it_is_allocated(runner: Runner) -> None:
    """POOL_2D with p0 = 2143289344 (a NaN's bits): a padded copy of 479 GiB."""
    spec = node(GGMLOp.POOL_2D, tensor(F32, [6, 5, 3, 1], 0), [1, 3, 2, 2, 2, 2143289344, 0],
                tensor(F32, [12, 10, 3, 1], 1))
    refused(runner, spec, OutOfMemoryError, "POOL_2D", "'dst'", "bytes")


def test_arange_of_nan_is_refused(runner: Runner) -> None:
    spec = node(GGMLOp.ARANGE, tensor(F32, [3, 1, 1, 1], 0), [0, NAN_BITS, 0x3F800000])
    refused(runner, spec, ArgumentError, "ARANGE", "'dst'", "nan")


def test_set_over_another_shape_is_refused(runner: Runner) -> None:
    """SET's src0 of another shape than dst: numpy's broadcast error before."""
    spec = node(GGMLOp.SET, tensor(F32, [16, 7, 2, 1], 0), [64, 512, 1024, 140], tensor(F32, [16, 8, 2, 1], 1),
                tensor(F32, [5, 3, 2, 1], 2))
    refused(runner, spec, ShapeError, "SET", "'dst'", "[16, 8, 2, 1]", "[16, 7, 2, 1]")


def test_rope_with_negative_sections_is_refused(runner: Runner) -> None:
    """MROPE (mode 8) with a negative section indexed its angle table before its start."""
    # n_dims 8, mode MROPE, freq_base 10000, freq_scale 1, attn_factor 1, sections (4, -6, 2, 0)
    params = [0, 8, 8, 0, 0, 0x461C4000, 0x3F800000, 0, 0x3F800000, 0, 0, 4, -6, 2, 0]
    spec = node(GGMLOp.ROPE, tensor(F32, [8, 2, 3, 1], 0), params, tensor(F32, [8, 2, 3, 1], 1),
                tensor(I32, [12, 1, 1, 1], 2))
    refused(runner, spec, ArgumentError, "ROPE", "'dst'", "[4, -6, 2, 0]")


def test_get_rows_index_outside_is_refused_when_computed(runner: Runner) -> None:
    """Indices are data: checked against the rows each time the node computes, before a row is read."""
    spec = node(GGMLOp.GET_ROWS, tensor(F32, [4, 3, 1, 1], 0), [], tensor(F32, [4, 5, 1, 1], 1),
                tensor(I32, [3, 1, 1, 1], 2))
    refused(runner, spec, OutOfBoundsError, "GET_ROWS", "'dst'", "row index 7", "[0, 5)",
            values={1: np.array([1, 7, 2], np.int32)})
    refused(runner, spec, OutOfBoundsError, "row index -1", values={1: np.array([1, -1, 2], np.int32)})


def test_flash_attention_mask_of_fewer_rows_is_refused(runner: Runner) -> None:
    """F16 K and V walk each q row's mask row unchecked: a mask of 2 rows under 4 q rows was read past its
    end."""
    n, n_kv, dk, nh = 4, 32, 16, 2
    q = tensor(F32, [dk, n, nh, 1], 1)
    k, v = tensor(F16, [dk, n_kv, 1, 1], 2), tensor(F16, [dk, n_kv, 1, 1], 3)
    dst = tensor(F32, [dk, nh, n, 1], 0)
    scale = 0x3E800000  # 0.25
    short = node(GGMLOp.FLASH_ATTN_EXT, dst, [scale], q, k, v, tensor(F16, [n_kv, 2, 1, 1], 4))
    refused(runner, short, ShapeError, "FLASH_ATTN_EXT", "'dst'", "[32, 2, 1, 1]", "4 q rows")
    whole = node(GGMLOp.FLASH_ATTN_EXT, dst, [scale], q, k, v, tensor(F16, [n_kv, n, 1, 1], 4))
    assert runner.run(whole).status == "computed"


def test_rms_norm_of_zero_rows_without_eps_divides_as_c(runner: Runner) -> None:
    """1 / sqrt(0 + 0): C's infinity times 0 (NaN), where the compiled kernel raised ZeroDivisionError."""
    spec = node(GGMLOp.RMS_NORM, tensor(F32, [8, 2, 1, 1], 0), [0], tensor(F32, [8, 2, 1, 1], 1))
    with runner.placed(spec) as p:
        np.copyto(p.arena, p.data)
        x = p.node.src[0]
        assert x is not None and x.data is not None
        off = x.data - p.arena.ctypes.data
        p.arena[off: off + 64] = 0
        graph = Graph(1)
        graph.nodes = [p.node]
        with np.errstate(invalid="ignore"):  # 0 * inf, as C computes it
            runner.backend.graph_compute(graph)
        out = p.arena[p.node.data - p.arena.ctypes.data:][:64].view(np.float32)  # type: ignore[operator]
        assert np.isnan(out).all()


def test_im2col_1d_row_padding_is_refused(runner: Runner) -> None:
    """A 1-D IM2COL is the 2-D rule with one row: p1 = -3 asked for a padded copy of negative size."""
    im2col = [1, 0, 0, -3, 1, 0, 0]  # s0, s1, p0, p1, d0, d1, is_2D
    spec = node(GGMLOp.IM2COL, tensor(F32, [6, 8, 1, 1], 0), im2col, tensor(F32, [3, 2, 1, 1], 1),
                tensor(F32, [10, 2, 1, 1], 2))
    refused(runner, spec, ArgumentError, "IM2COL", "'dst'", "paddings (0, -3)")
    spec.params[3] = 0
    assert runner.run(spec).status == "computed"


def test_a_destination_whose_elements_overlap_is_refused(runner: Runner) -> None:
    """MUL_MAT into a dst with nb[1] = 0 (its rows all one row): BLAS refused the output stride, printed its
    complaint on the standard output and left dst as it was; refused, the node says so."""
    overlapping = tensor(F32, [4, 40, 1, 1], 0, nb=[4, 0, 16, 16])
    spec = node(GGMLOp.MUL_MAT, overlapping, [], tensor(F32, [8, 4, 1, 1], 1), tensor(F32, [8, 40, 1, 1], 2))
    with runner.placed(spec) as p:
        graph = Graph(1)
        graph.nodes = [p.node]
        with pytest.raises(LayoutError) as info:
            runner.backend.graph_plan_create(graph)
    for fragment in ("MUL_MAT", "'dst'", "overlap", "[4, 0, 16, 16]"):
        assert fragment in str(info.value), str(info.value)
    still_adds(runner)


# --- every weight type, its blocks random bytes (a client's) ---


@pytest.mark.slow
@pytest.mark.parametrize("wtype", list(QUANT_MUL_MAT_TYPES), ids=lambda t: t.name)
def test_every_quantized_weight_type_computes_within_its_bytes(runner: Runner, wtype: GGMLType) -> None:
    """MUL_MAT (1 and 9 columns: row loops, tiles) and GET_ROWS over blocks of random bytes, as a client may send:
    every scale, grid index and sign any byte can say; the result depends only on the tensors' bytes."""
    k = 512
    w = tensor(wtype, [k, 16, 1, 1], 1)
    for n in (1, 9):
        spec = node(GGMLOp.MUL_MAT, tensor(F32, [16, n, 1, 1], 0), [], w, tensor(F32, [k, n, 1, 1], 2))
        assert runner.run(spec).status == "computed", (wtype.name, n)
    # the indices are random too: computed, or refused for an index outside the rows, never read outside
    rows = node(GGMLOp.GET_ROWS, tensor(F32, [k, 3, 1, 1], 0), [], w, tensor(I32, [3, 1, 1, 1], 2))
    outcome = runner.run(rows)
    assert outcome.status == "computed" or (outcome.status == "refused" and "outside [0, 16)" in outcome.message), \
        (wtype.name, outcome.status, outcome.message)
