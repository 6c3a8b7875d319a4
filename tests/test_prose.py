"""The hot files keep about the share of prose ggml's C files have: comment and docstring lines under 12%."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_PROSE_SHARE = 0.12

# files of at least 150 non-blank lines held under MAX_PROSE_SHARE (issue 42, point 3)
HOT_FILES = (
    "pyggml/sched/backend_sched.py",
    "pyggml/sched/passes.py",
    "pyggml/alloc/graph_allocator.py",
    "pyggml/alloc/tensor_allocator.py",
    "pyggml/alloc/report.py",
    "pyggml/ggml_backend/backend.py",
    "pyggml/ggml_backend/buffer.py",
    "pyggml/ggml_backend/device.py",
    "pyggml/ggml_backend/registry.py",
    "pyggml/ggml_backend/tensor_io.py",
    "pyggml/core/context.py",
    "pyggml/core/graph.py",
    "pyggml/core/tensor.py",
    "pyggml/core/types.py",
    "pyggml/backends/rpc/client.py",
    "pyggml/backends/rpc/connection.py",
    "pyggml/backends/rpc/server.py",
    "pyggml/backends/rpc/wire.py",
    "pyggml/models/arch.py",
    "pyggml/models/chat.py",
    "pyggml/models/kv_cache.py",
    "pyggml/models/model.py",
    "pyggml/models/tokenizer/core.py",
    "pyggml/backends/cpu/backend.py",
    "pyggml/backends/cpu/buffer.py",
    "pyggml/backends/cpu/jit.py",
    "pyggml/backends/cpu/plan.py",
    "pyggml/backends/cpu/repack.py",
    "pyggml/backends/cpu/kernels/_common.py",
    "pyggml/backends/cpu/kernels/conv_back.py",
    "pyggml/backends/cpu/kernels/matmul_id.py",
    "pyggml/backends/cpu/kernels/norm.py",
    "pyggml/backends/cpu/kernels/matmul.py",
    "pyggml/backends/cpu/kernels/simd_math.py",
    "pyggml/backends/cpu/kernels/ssm.py",
    "pyggml/backends/cpu/kernels/threads.py",
    "pyggml/backends/cpu/kernels/vec_dot/dequantize.py",
    "pyggml/backends/cpu/kernels/vec_dot/float_loops.py",
    "pyggml/backends/cpu/kernels/vec_dot/ir.py",
    "pyggml/backends/cpu/kernels/vec_dot/kquant_loops.py",
    "pyggml/backends/cpu/kernels/vec_dot/mul_mat_job.py",
    "pyggml/backends/cpu/kernels/vec_dot/quant_loops.py",
    "pyggml/backends/cpu/kernels/vec_dot/quantize_src1.py",
    "pyggml/backends/cpu/kernels/vec_dot/tiles_x8.py",
)


def prose_lines(source: str) -> tuple[int, int]:
    """(lines holding a comment or a docstring, non-blank lines) of Python `source`."""
    prose = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                prose.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return len(prose), sum(1 for line in source.splitlines() if line.strip())


def test_prose_lines_counts_comments_and_docstrings_only() -> None:
    source = '"""Module.\n\nMore."""\n\nX = 1  # why\n\n\ndef f() -> str:\n    """One line."""\n    return "# no"\n'
    assert prose_lines(source) == (5, 6)


@pytest.mark.parametrize("path", HOT_FILES)
def test_hot_file_prose_share(path: str) -> None:
    n_prose, n_lines = prose_lines((ROOT / path).read_text(encoding="utf-8"))
    assert n_lines > 0
    assert n_prose / n_lines < MAX_PROSE_SHARE, (
        f"{path}: {n_prose} of {n_lines} non-blank lines are comments or docstrings "
        f"({n_prose / n_lines:.1%}, the limit is {MAX_PROSE_SHARE:.0%}): say why in one line, move the rest to "
        f"DESIGN.md or benchmarks/README.md")
