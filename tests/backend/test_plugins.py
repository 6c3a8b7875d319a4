"""Backends as plug-ins: entry points of the group `pyggml.backends`, and the example out-of-tree backend.

Discovery is tested with a fake distribution (a `*.dist-info` directory with an `entry_points.txt` on
sys.path), as pip would install one; the example backend (examples/numpy_backend) is loaded by path,
then checked with `pyggml test-ops -b numpy` and run split with the CPU backend. Every test works on a
copy of the registry's state (`isolated`).
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tomllib
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
from tiny_backend import REG_MODULE

import pyggml.models as pm
from pyggml.cli import devices
from pyggml.cli.main import main
from pyggml.core.errors import ArgumentError
from pyggml.ggml_backend import init_backend, list_backends, load, load_all, registry
from pyggml.models import builtin_model_path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "numpy_backend"
EXAMPLE_MODULE = EXAMPLE / "pyggml_numpy_backend.py"


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry's state copied, restored after the test."""
    monkeypatch.setattr(registry, "_regs", dict(registry._regs))
    monkeypatch.setattr(registry, "_devices", list(registry._devices))
    monkeypatch.setattr(registry, "_entry_points", registry._entry_points)
    monkeypatch.setattr(registry, "_load_errors", dict(registry._load_errors))


FAKE_MODULE = REG_MODULE.format(name="FakeEP")


def fake_distribution(root: Path, entry_points: str) -> None:
    """What pip leaves in site-packages for a package with entry points: the module and its dist-info."""
    (root / "fake_ep_backend.py").write_text(FAKE_MODULE)
    info = root / "fake_ep_backend-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-ep-backend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)


def test_entry_points_are_found_by_name_and_loaded_lazily(isolated: None, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    fake_distribution(tmp_path, "[pyggml.backends]\nfakeep = fake_ep_backend:ggml_backend_init\n"
                                "brokenep = no_such_module_for_pyggml:ggml_backend_init\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_ep_backend", raising=False)
    registry._scan_entry_points()  # what the first lookup of a name does
    assert {"cpu", "fakeep", "brokenep"} <= set(list_backends())
    assert "fake_ep_backend" not in sys.modules  # listed, not imported
    backend = init_backend("FakeEP")
    assert "fake_ep_backend" in sys.modules and backend.get_device().backend_reg().name() == "FakeEP"
    with pytest.raises(ArgumentError, match=r"backend 'brokenep' \(entry point no_such_module_for_pyggml:"
                                            r"ggml_backend_init of fake-ep-backend\) cannot be loaded: "
                                            r"ModuleNotFoundError"):
        init_backend("brokenep")
    load_all()  # enumerating does not raise for a broken entry point: it is remembered
    assert "ModuleNotFoundError" in registry.load_errors()["brokenep"]
    out = io.StringIO()
    assert devices.run(Namespace(), out) == 0
    assert "| FakeEP" in out.getvalue() and "not loaded: brokenep: ModuleNotFoundError" in out.getvalue()


def test_an_entry_point_installed_after_the_first_lookup_is_found(isolated: None, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert "cpu" in list_backends()  # the entry points were listed already
    fake_distribution(tmp_path, "[pyggml.backends]\nlateep = fake_ep_backend:ggml_backend_init\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_ep_backend", raising=False)
    assert init_backend("lateep").name() == "Tiny"


def test_pyggml_registers_its_own_backends_as_entry_points() -> None:
    project = tomllib.loads((EXAMPLE.parents[1] / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["pyggml.backends"] == {
        "cpu": "pyggml.backends.cpu.device:cpu_reg", "torch": "pyggml.backends.torch.device:torch_reg",
        "rpc": "pyggml.backends.rpc.client:rpc_reg"}


# --- the example backend ---


def code_lines(path: Path) -> int:
    """Lines of code: not blank, not a comment, not part of a docstring."""
    source = path.read_text()
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(node) is not None:
            doc = node.body[0]
            docstrings.update(range(doc.lineno, (doc.end_lineno or doc.lineno) + 1))
    return sum(1 for i, line in enumerate(source.splitlines(), 1)
               if line.strip() and not line.strip().startswith("#") and i not in docstrings)


def test_the_example_is_a_small_package_with_its_entry_point() -> None:
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    assert project["name"] == "pyggml-numpy-backend"
    assert project["entry-points"]["pyggml.backends"] == {"numpy": "pyggml_numpy_backend:ggml_backend_init"}
    assert code_lines(EXAMPLE_MODULE) <= 200
    assert "## Writing a backend" in (EXAMPLE / "README.md").read_text()


def test_the_example_loads_by_path(isolated: None) -> None:
    reg = load(EXAMPLE_MODULE)
    assert reg.name() == "numpy" and "numpy" in list_backends()
    (dev,) = reg.devices()
    props = dev.get_props()
    assert (props.name, props.type.name) == ("numpy", "ACCEL") and 0 < props.memory_free <= props.memory_total
    backend = init_backend("numpy")
    buft = backend.get_default_buffer_type()
    assert backend.get_device() is dev and buft.is_host() and buft.get_alignment() == 64
    buf = backend.alloc_buffer(100)
    assert buf.backend is backend and buf.is_host()
    buf.free()


@pytest.mark.slow
def test_the_example_passes_test_ops_for_what_it_claims(isolated: None, capsys: pytest.CaptureFixture[str]) -> None:
    load(EXAMPLE_MODULE)
    assert main(["test-ops", "-b", "numpy"]) == 0
    out = capsys.readouterr().out
    m = re.search(r"^(\d+)/(\d+) passed, 0 failed, (\d+) not supported$", out, re.M)
    assert m is not None, out[-2000:]
    assert int(m.group(1)) >= 100  # MUL_MAT, ROPE, SOFT_MAX, RMS_NORM, GET_ROWS, ... all claimed and right


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["run", "-n", "24", "--temp", "0", "--seed", "1", *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("split", [[], ["--n-layers-on", "numpy=2"]], ids=["all-layers", "two-layers"])
@pytest.mark.slow
def test_the_example_runs_the_builtin_model_split_with_the_cpu(isolated: None, split: list[str],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    load(EXAMPLE_MODULE)
    want = _run([], capsys)
    assert _run(["--backend", "numpy", "--backend", "cpu", *split], capsys) == want


@pytest.mark.slow
def test_nodes_the_layer_backend_lacks_go_to_the_next_backend(isolated: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ROPE and SOFT_MAX in the example, the model's layers still run on it: the scheduler gives
    those nodes to the CPU (more splits), and the greedy tokens do not change."""
    reg = load(EXAMPLE_MODULE)
    module = sys.modules[type(reg).__module__]
    ids = None
    tokens = []
    for lacking in ((), ("ROPE", "SOFT_MAX")):
        for op in lacking:
            monkeypatch.delitem(module.SUPPORTS, getattr(module.GGMLOp, op))
        model = pm.load(builtin_model_path(), backends=["numpy", "cpu"], n_ctx=64, progress=False)
        try:
            ids = ids or model.tokenize("The module")
            tokens.append(list(model.generate(ids, 12)))
            backends = {s.backend.name() for s in model.runner.sched.splits}
            assert backends == ({"numpy"} if not lacking else {"numpy", "CPU"})
            assert model.weights.buffers[0].get_usage().name == "WEIGHTS"
        finally:
            model.free()
    assert tokens[0] == tokens[1]
    assert np.all(np.asarray(tokens[0]) >= 0)
