"""The layers stay layers: read every module's imports (ast) and the identities it tests.

- core, backend, alloc and sched each import only the layers above them (DESIGN.md's table), and none of
  them, nor gguf, models or cli, imports a concrete backend (`pyggml.backends.<name>`): they find
  backends through the registry, whose entry points import a backend by name at run time.
- A backend package does not import another backend package.
- The seed (`pyggml.seed`, late-2023 ggml kept for the seed-exact tests) is sealed: nothing outside it imports
  it but the C API's entry points (`pyggml.capi`), so the engine cannot lean on it.
- The words that compare the seed with the reference ("seed's", "today's", "2023") stay in the seed package,
  but where a file below names the seed it still serves (SEED_WORDS_ALLOWED, each with why).
- No code tests which backend it has with `is_cpu` outside the CPU backend's package (and the C API's
  `ggml_backend_is_cpu`, which is that test by its C name): capabilities are asked of devices and
  buffer types instead.

Imports anywhere in a module count (inside functions too), relative ones resolved.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pyggml"

# each layer and the layers it may import (besides itself and the standard library)
LAYERS = {
    "core": set(),
    "ggml_backend": {"core"},
    "alloc": {"core", "ggml_backend"},
    "sched": {"core", "ggml_backend", "alloc"},
    "seed": {"core", "ggml_backend", "alloc", "sched"},
}
# the packages that may import the seed besides itself: the C API, whose seed-form entry points return it
SEED_IMPORTERS = ("seed", "capi")
NO_CONCRETE_BACKEND = ("core", "ggml_backend", "alloc", "sched", "gguf", "models", "cli")

# Known imports that break the rules above, each with why it is still there. Nothing else may be added:
# a new entry needs its TODO and an issue.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()  # (file, module) pairs allowed for now: none


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def imported(path: Path) -> set[str]:
    """Every module a file imports: `import a.b` gives a.b; `from a.b import c` gives a.b and a.b.c."""
    package = ["pyggml", *path.relative_to(PACKAGE).parts[:-1]]  # what a relative import starts from
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def backend_package(module: str) -> str | None:
    """The concrete backend a module name belongs to ("pyggml.backends.cpu.kernels" -> "cpu"), or None."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[:2] == ["pyggml", "backends"]:
        return parts[2]
    return None


def known(rel: str, module: str) -> bool:
    return any(r == rel and (module == m or module.startswith(m + ".")) for r, m in KNOWN_VIOLATIONS)


def violations() -> list[str]:
    """One line per module and thing it must not import (a backend package, a layer below it)."""
    found: set[str] = set()
    for path in _modules():
        rel = _rel(path)
        parts = path.relative_to(PACKAGE).parts
        layer = parts[0] if len(parts) > 1 else None
        own_backend = parts[1] if layer == "backends" and len(parts) > 2 else None
        for module in imported(path):
            target = backend_package(module)
            if target is not None and not known(rel, module):
                if layer in NO_CONCRETE_BACKEND:
                    found.add(f"{rel} imports the concrete backend pyggml.backends.{target}")
                elif own_backend is not None and target != own_backend:
                    found.add(f"{rel} (backend {own_backend}) imports another backend, pyggml.backends.{target}")
            if layer in LAYERS and module.startswith("pyggml."):
                other = module.split(".")[1]
                if other in LAYERS and other != layer and other not in LAYERS[layer]:
                    found.add(f"{rel} (layer {layer}) imports layer {other}, below it")
    return sorted(found)


SEED_WORDS = re.compile(r"seed's|today's|2023", re.IGNORECASE)
# files outside pyggml/seed that may name the seed, and why
SEED_WORDS_ALLOWED = {
    "pyggml/capi/sched.py": "the C API's two-argument ggml_backend_sched_new is the seed's entry point",
    "pyggml/capi/alloc.py": "the C API's legacy ggml_allocr_* and the seed's static helpers are entry points",
    "pyggml/testing/graphs.py": "the late-2023 LLaMA graph the seed-exact allocation tests pin",
}


def seed_words() -> list[str]:
    """Lines outside pyggml/seed (and SEED_WORDS_ALLOWED) that name the seed or 'today's' ggml."""
    found: list[str] = []
    for path in _modules():
        rel = _rel(path)
        if rel.startswith("pyggml/seed/") or any(rel == a or a.endswith("/") and rel.startswith(a)
                                                  for a in SEED_WORDS_ALLOWED):
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if SEED_WORDS.search(line):
                found.append(f"{rel}:{i}: {line.strip()}")
    return found


def seed_imports() -> list[str]:
    """Where a module outside SEED_IMPORTERS imports pyggml.seed."""
    found: list[str] = []
    for path in _modules():
        parts = path.relative_to(PACKAGE).parts
        if len(parts) > 1 and parts[0] in SEED_IMPORTERS:
            continue
        found.extend(f"{_rel(path)} imports {m}" for m in sorted(imported(path))
                     if m == "pyggml.seed" or m.startswith("pyggml.seed."))
    return found


def is_cpu_uses() -> list[str]:
    """Where `is_cpu` is named (called, imported, an attribute) outside the CPU package and capi's wrapper."""
    found: list[str] = []
    for path in _modules():
        rel = _rel(path)
        if rel.startswith("pyggml/backends/cpu/"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        allowed: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and (rel, node.name) == ("pyggml/capi/backend.py",
                                                                           "ggml_backend_is_cpu"):
                allowed.update(id(n) for n in ast.walk(node))
        for node in ast.walk(tree):
            name = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                    else None)
            if isinstance(node, ast.alias):
                name = node.asname or node.name.rpartition(".")[2]
            if name == "is_cpu" and id(node) not in allowed:
                found.append(f"{rel}:{getattr(node, 'lineno', '?')} names is_cpu")
    return found


def test_layers_import_only_what_is_above_them_and_no_concrete_backend() -> None:
    assert violations() == []


def test_nothing_but_the_c_api_imports_the_seed() -> None:
    assert seed_imports() == []


def test_the_seed_is_named_only_in_the_seed_package() -> None:
    assert seed_words() == []


def test_the_checker_finds_an_import_of_the_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "pyggml"
    (fake / "models").mkdir(parents=True)
    (fake / "models" / "m.py").write_text("def f():\n    from pyggml.seed import Scheduler\n", encoding="utf-8")
    (fake / "capi").mkdir(parents=True)
    (fake / "capi" / "sched.py").write_text("from pyggml.seed.scheduler import Scheduler\n", encoding="utf-8")
    (fake / "sched").mkdir(parents=True)
    (fake / "sched" / "s.py").write_text("from ..seed import passes\n", encoding="utf-8")
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    assert seed_imports() == ["pyggml/models/m.py imports pyggml.seed", "pyggml/models/m.py imports "
                              "pyggml.seed.Scheduler", "pyggml/sched/s.py imports pyggml.seed",
                              "pyggml/sched/s.py imports pyggml.seed.passes"]
    assert violations() == ["pyggml/sched/s.py (layer sched) imports layer seed, below it"]


def test_no_is_cpu_outside_the_cpu_backend() -> None:
    assert is_cpu_uses() == []


def test_known_violations_are_still_there() -> None:
    """An entry of KNOWN_VIOLATIONS whose import is gone must leave the list (it would hide a new one)."""
    for rel, module in KNOWN_VIOLATIONS:
        path = PACKAGE.parent / rel
        assert path.exists(), rel
        assert any(m == module or m.startswith(module + ".") for m in imported(path)), (
            f"{rel} no longer imports {module}: remove it from KNOWN_VIOLATIONS")


@pytest.mark.parametrize("source, want", [
    ("from pyggml.backends.cpu import cpu_init\n", "imports the concrete backend pyggml.backends.cpu"),
    ("import pyggml.backends.torch.buffer\n", "imports the concrete backend pyggml.backends.torch"),
    ("def f():\n    from pyggml.backends import cpu\n", "imports the concrete backend pyggml.backends.cpu"),
    ("from pyggml.sched import BackendSched\n", "(layer ggml_backend) imports layer sched, below it"),
])
def test_the_checker_finds_a_new_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str,
                                        want: str) -> None:
    """The checks fail on an import they must catch (a module written into a copy of the layer layout)."""
    fake = tmp_path / "pyggml"
    (fake / "ggml_backend").mkdir(parents=True)
    (fake / "ggml_backend" / "bad.py").write_text(source, encoding="utf-8")
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    found = violations()
    assert len(found) == 1 and want in found[0], found


def test_the_checker_finds_is_cpu_and_a_backend_importing_another(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "pyggml"
    (fake / "models").mkdir(parents=True)
    (fake / "models" / "m.py").write_text("def f(b):\n    return b.is_cpu\n", encoding="utf-8")
    (fake / "backends" / "numpy").mkdir(parents=True)
    (fake / "backends" / "numpy" / "k.py").write_text("from ..torch.buffer import view\n", encoding="utf-8")
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    assert is_cpu_uses() == ["pyggml/models/m.py:2 names is_cpu"]
    assert violations() == ["pyggml/backends/numpy/k.py (backend numpy) imports another backend, "
                            "pyggml.backends.torch"]
