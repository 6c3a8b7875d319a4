"""`pyggml test-ops -b torch`: every case the torch backend supports agrees with the CPU backend."""

from __future__ import annotations

import io
import re

import pytest

pytest.importorskip("torch")

from pyggml.testing import op_check

# the ops the torch backend implements: each must have passing cases, none failing
TORCH_OPS = ["ADD", "MUL", "SCALE", "RMS_NORM", "NORM", "SOFT_MAX", "ROPE", "GET_ROWS", "CPY", "CONT", "DUP", "VIEW",
             "RESHAPE", "PERMUTE", "TRANSPOSE", "GELU", "SILU", "RELU", "MUL_MAT", "SET_ROWS", "REGLU", "GEGLU",
             "SWIGLU", "SWIGLU_OAI", "GEGLU_ERF", "GEGLU_QUICK", "SWIGLU_CLAMP", "FLASH_ATTN_EXT",
             "MUL_MAT_ID", "ADD_ID"]


@pytest.mark.parametrize("name", ["torch:cpu,matmul_precision=f32", "torch:cpu,matmul_precision=f16",
                                  "torch:cpu,matmul_precision=bf16"])
@pytest.mark.slow
def test_checker_is_clean_for_the_torch_backend(name: str) -> None:
    """Under each matmul precision (MUL_MAT's NMSE threshold, 5e-4, holds bf16 products too)."""
    out = io.StringIO()
    code = op_check.run(name, None, out, verbose=False)
    text = out.getvalue()
    assert text.startswith("Testing backend Torch(cpu) against CPU")
    failures = [line for line in text.splitlines() if line.rstrip().endswith("FAIL") or " FAIL (" in line]
    assert code == 0 and not failures, "\n".join(failures)
    summary = re.search(r"(\d+)/(\d+) passed, (\d+) failed, (\d+) not supported", text)
    assert summary is not None and summary.group(3) == "0"
    ok = {line.split()[0] for line in text.splitlines()[2:] if line.rstrip().endswith(" OK")}
    assert set(TORCH_OPS) <= ok, sorted(set(TORCH_OPS) - ok)
    # the MUL_MAT weight types the backend takes were all checked
    for t in ("type_a=f32", "type_a=f16", "type_a=bf16", "type_a=q8_0", "type_a=q4_0", "type_a=q4_1", "type_a=q4_K"):
        assert re.search(rf"MUL_MAT\s+{t},.*OK", text), t
