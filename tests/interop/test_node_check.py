"""pyggml.testing.node_check: each node of the built-in model recomputed by libggml from pyggml's inputs. With the
host's numerics every checked node is libggml's bit for bit; under "ref" (ggml's C without SIMD, which this
machine's libggml is not) the products and SwiGLU's vector exp differ, and the checker names them."""

from __future__ import annotations

import pytest

import pyggml.models as pm
from pyggml.backends.cpu.numerics import host_numerics
from pyggml.models.builtin import builtin_model_path
from pyggml.testing import node_check

PROMPT = "The module of the file and the path"


@pytest.mark.parametrize("numerics", ["host", "ref"])
def test_node_check_names_the_kernels_that_differ(ggml_c_lib: object, monkeypatch: pytest.MonkeyPatch,
                                                   numerics: str) -> None:
    if numerics == "ref":
        monkeypatch.setenv("PYGGML_CPU_NUMERICS", "ref")
    model = pm.load(builtin_model_path(), n_ctx=64, n_threads=1, progress=False)
    try:
        differ, checked = node_check.check_tokens(model, model.tokenize(PROMPT))
    finally:
        model.free()
    assert checked["MUL_MAT/F16"] > 0 and checked["RMS_NORM/F32"] > 0
    kinds = {d.key for d in differ}
    if numerics == "host" and host_numerics() == "x86":
        assert not differ, [(d.name, d.op, d.relative) for d in differ[:5]]
    if numerics == "ref":
        assert {"MUL_MAT/F16", "MUL_MAT/F32"} <= kinds and all(0 < d.relative < 1e-3 for d in differ)
        assert "RMS_NORM/F32" not in kinds  # the same double sum under both numerics


def test_node_check_command_line(ggml_c_lib: object, capsys: pytest.CaptureFixture[str]) -> None:
    rc = node_check.main([str(builtin_model_path()), PROMPT, "-c", "64"])
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("checked: ") and "MUL_MAT/F16" in out
    assert (rc == 0) == ("differ: none" in out)
    assert rc == 0 or host_numerics() != "x86"
