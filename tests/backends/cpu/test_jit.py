"""Numba's compilation of the CPU kernels: one weight type compiled at a time, cached where the package can
write or else in pyggml's user cache, and compiles heard as they start and end."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest
from numba import njit, types
from numba.core import caching, config

from pyggml.backends.cpu import jit
from pyggml.backends.cpu.kernels.vec_dot import mul_mat_job

_InTree = getattr(caching, "InTreeCacheLocator", None) or caching._InTreeCacheLocator
_CacheImpl = getattr(caching, "CacheImpl", None) or caching._CacheImpl


def test_the_package_locator_comes_right_after_the_in_tree_one() -> None:
    jit.install_cache_locator()
    jit.install_cache_locator()  # twice: still once in the list
    locators = _CacheImpl._locator_classes
    assert locators.count(jit.PackageCacheLocator) == 1
    assert locators.index(jit.PackageCacheLocator) == locators.index(_InTree) + 1
    assert locators.index(jit.BackendInTreeLocator) == locators.index(_InTree) - 1
    assert locators.index(jit.BackendUserProvidedLocator) < locators.index(jit.BackendInTreeLocator)


def test_a_backend_source_is_stamped_with_the_backend_modules_it_imports(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel inlines functions of the modules it imports: editing one of them, directly imported or not,
    makes its cached code stale; editing a module it does not import does not; other sources keep numba's
    own stamp."""
    backend = tmp_path / "pyggml" / "backends" / "cpu"
    (backend / "kernels").mkdir(parents=True)
    (backend / "kernels" / "__init__.py").write_text("")
    (backend / "kernels" / "job.py").write_text("from pyggml.backends.cpu.kernels import loops\nimport numpy\n")
    (backend / "kernels" / "loops.py").write_text("from pyggml.backends.cpu.kernels.ir import load\n")
    (backend / "kernels" / "ir.py").write_text("def load(): pass\n")
    (backend / "kernels" / "other.py").write_text("X = 1\n")
    monkeypatch.setattr(jit, "_BACKEND_ROOT", backend)

    def job() -> None:
        pass

    locator = jit.BackendInTreeLocator.from_function(job, str(backend / "kernels" / "job.py"))
    assert locator is not None
    stamps = [locator.get_source_stamp()]
    (backend / "kernels" / "other.py").write_text("X = 2\n")  # not imported by job.py
    stamps.append(locator.get_source_stamp())
    (backend / "kernels" / "ir.py").write_text("def load(): return 1\n")  # imported through loops.py
    stamps.append(locator.get_source_stamp())
    assert stamps[0] == stamps[1] != stamps[2]
    assert stamps[2] == jit.sources_stamp(str(backend / "kernels" / "job.py"))
    assert jit.BackendInTreeLocator.from_function(job, np.__file__) is None  # others' files: numba's locators
    outside = jit.PackageCacheLocator.from_function(jit._probe, jit.__file__)  # jit.py is outside tmp_path
    assert outside is not None and outside.get_source_stamp() != stamps[2]


def test_a_read_only_package_caches_in_the_user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYGGML_CACHE", str(tmp_path))
    monkeypatch.setattr(config, "CACHE_DIR", "")
    writable = jit.cache_folder(mul_mat_job.__file__)
    assert writable == str(Path(mul_mat_job.__file__).parent / "__pycache__")  # a clone: beside the source
    monkeypatch.setattr(_InTree, "from_function", classmethod(lambda cls, fn, path: None))  # read-only
    folder = jit.cache_folder(mul_mat_job.__file__)
    assert folder is not None and Path(folder).parent == tmp_path / "numba"
    assert jit.PackageCacheLocator.from_function(jit._probe, np.__file__) is None  # others' files: numba's


def test_numba_cache_dir_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path))
    folder = jit.cache_folder(mul_mat_job.__file__)
    assert folder is not None and Path(folder).parent == tmp_path


_ONE_TYPE = """
import json, sys
import numpy as np
from numba.core import caching
intree = getattr(caching, "InTreeCacheLocator", None) or caching._InTreeCacheLocator
intree.from_function = classmethod(lambda cls, fn, path: None)  # as if the package were read-only
from pyggml.backends.cpu.kernels.vec_dot import kinds, mul_mat_job, quantize_src1, reference_dots
mul_mat_job.job_address(kinds.Q5_1, quantize_src1.ROUND_REF)
print(json.dumps({"q5_1": len(reference_dots.dot_q5_1.signatures),
                  "iq4_xs": len(reference_dots.dot_iq4_xs.signatures)}))
"""


@pytest.mark.slow
def test_a_job_compiles_its_weight_type_alone_into_the_user_cache(tmp_path: Path) -> None:
    """A fresh process with an empty cache and a read-only package: the Q5_1 job compiles Q5_1's dot and no
    other type's, and its code lands in PYGGML_CACHE/numba; a second process loads it, compiling nothing."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["PYGGML_CACHE"] = str(tmp_path)
    cmd = [sys.executable, "-c", _ONE_TYPE]
    first = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True,
                                      timeout=600).stdout)
    assert first == {"q5_1": 1, "iq4_xs": 0}
    cached = [p.name for p in (tmp_path / "numba").rglob("*.nbi")]
    assert any(name.startswith("mul_mat_job.mul_mat_Q5_1_ref-") for name in cached), cached
    second = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True,
                                       timeout=600).stdout)
    assert second["q5_1"] == 0  # the job came from the cache: its callee was not compiled either


def test_watch_compiles_hears_the_outermost_compile_once() -> None:
    @njit
    def inner(x: int) -> int:
        return x + 1

    @njit
    def outer(x: int) -> int:
        return inner(x) * 2

    heard: list[tuple[str, object]] = []
    with jit.watch_compiles(lambda name, src: heard.append(("start", name)),
                            lambda name, sec: heard.append(("end", name))):
        assert outer(1) == 4
        assert outer(2) == 6  # compiled already: nothing heard
    assert heard == [("start", outer.py_func.__qualname__), ("end", outer.py_func.__qualname__)]

    @njit
    def later(x: int) -> int:
        return x

    later(1)  # outside the block
    assert len(heard) == 2


def test_compiled_address_calls_the_function() -> None:
    @njit
    def add_to(p, n):  # type: ignore[no-untyped-def]
        a = numba.carray(p, (2,))
        a[0] += n
        return a[1]

    sig = types.int64(types.CPointer(types.int64), types.int64)
    fn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.c_int64)(
        jit.compiled_address(add_to, sig))
    a = np.array([5, 7], np.int64)
    assert fn(a.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), 3) == 7
    assert a[0] == 8
