"""The quick loop's markers: `interop` and `models` follow from the fixtures a test uses and its folder."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
# the top conftest by its path: `import conftest` could find a folder's own
_spec = importlib.util.spec_from_file_location("top_conftest", TESTS / "conftest.py")
assert _spec is not None and _spec.loader is not None
conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conftest)


@dataclass
class FakeItem:
    """What the hook reads of a collected test: its fixtures, path and parameters; what it adds."""

    fixturenames: list[str]
    path: Path
    callspec: Any = None
    marks: list[str] = field(default_factory=list)

    def add_marker(self, mark: pytest.MarkDecorator) -> None:
        self.marks.append(mark.name)


@dataclass
class FakeCallSpec:
    params: dict[str, Any]


@pytest.mark.parametrize("fixtures, path, params, want", [
    (["rng"], TESTS / "core" / "test_x.py", None, []),
    (["ggml_c_lib"], TESTS / "core" / "test_x.py", None, ["interop"]),
    (["llamacpp_models", "tmp_path"], TESTS / "models" / "test_x.py", None, ["interop"]),
    (["tmp_path"], TESTS / "interop" / "test_x.py", None, ["interop"]),
    (["smollm2_path"], TESTS / "cli" / "test_x.py", None, ["models"]),
    (["gemma3_path", "llamacpp_tools"], TESTS / "interop" / "test_x.py", None, ["interop", "models"]),
    (["endpoint"], TESTS / "backends" / "rpc" / "test_x.py", {"endpoint": "ggml-rpc-server"}, ["interop"]),
    (["endpoint"], TESTS / "backends" / "rpc" / "test_x.py", {"endpoint": "pyggml-rpc-server"}, []),
])
def test_markers_follow_fixtures_and_folder(fixtures: list[str], path: Path, params: dict[str, Any] | None,
                                            want: list[str]) -> None:
    item = FakeItem(fixtures, path, None if params is None else FakeCallSpec(params))
    conftest.pytest_collection_modifyitems(None, [item])  # type: ignore[arg-type, list-item]
    assert item.marks == want


def test_every_marker_is_registered(pytestconfig: pytest.Config) -> None:
    """--strict-markers refuses an unregistered one: the three the quick loop leaves out are registered."""
    names = {line.split(":")[0] for line in pytestconfig.getini("markers")}
    assert {"slow", "interop", "models"} <= names
