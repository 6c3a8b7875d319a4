"""Numba's compilation of the CPU kernels: where the compiled code is kept, who hears of a compile, and the
native address of a compiled function.

Numba compiles a kernel the first time it is called with new argument types
and keeps the machine code on disk (`cache=True`), so a compile happens once
per machine and source version. It keeps it beside the source (`__pycache__`)
where that folder is writable (a clone, an editable install); where it is not
(a package installed read-only), `install_cache_locator` sends pyggml's
kernels to `kernel_cache_dir()` (~/.cache/pyggml/numba) instead of numba's
own user folder, so that one folder holds them. NUMBA_CACHE_DIR, when set,
still wins for every function, as numba documents.

A compile takes seconds (a MUL_MAT job of one weight type, ~5-15 s on a
loaded machine): `watch_compiles` tells a caller (the command line's notice
and progress) when one starts and ends, and only when numba's cache did not
have it.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from numba.core import caching, event

from pyggml.cache import cache_dir

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the pyggml package folder
_CacheImpl: Any = getattr(caching, "CacheImpl", None) or caching._CacheImpl
_InTreeLocator: Any = getattr(caching, "InTreeCacheLocator", None) or caching._InTreeCacheLocator


def kernel_cache_dir() -> Path:
    """Where pyggml's compiled kernels go when the package's own folder is read-only."""
    return cache_dir() / "numba"


def _in_package(py_file: str) -> bool:
    try:
        return Path(py_file).resolve().is_relative_to(_PACKAGE_ROOT)
    except OSError:
        return False


class PackageCacheLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
    """numba's cache locator for pyggml's own sources, in `kernel_cache_dir()` (for other sources: none)."""

    def __init__(self, py_func: Any, py_file: str) -> None:
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = str(kernel_cache_dir() / self.get_suitable_cache_subpath(py_file))

    def get_cache_path(self) -> str:
        return self._cache_path

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> PackageCacheLocator | None:
        if not _in_package(py_file):
            return None
        return super().from_function(py_func, py_file)


def install_cache_locator() -> None:
    """Put PackageCacheLocator right after numba's in-tree one (the package's __pycache__, when writable) in
    the locators numba tries for a `cache=True` function; before the first kernel is decorated."""
    locators: list[Any] = _CacheImpl._locator_classes
    if PackageCacheLocator in locators:
        return
    at = locators.index(_InTreeLocator) + 1 if _InTreeLocator in locators else len(locators)
    locators.insert(at, PackageCacheLocator)


def cache_folder(source: str) -> str | None:
    """The folder where numba keeps the compiled code of the functions of the Python file `source`: that of
    the first locator numba would take (NUMBA_CACHE_DIR's, the source's __pycache__, kernel_cache_dir(), ...);
    None if none would."""
    for cls in _CacheImpl._locator_classes:
        locator = cls.from_function(_probe, source)  # a locator reads only the function's first line number
        if locator is not None:
            return str(locator.get_cache_path())
    return None


def _probe() -> None:
    """A function for cache_folder to show numba's locators."""


def compiled_address(fn: Any, sig: Any) -> int:
    """The C-callable address of the dispatcher `fn` compiled for `sig` (compiled, or loaded from numba's
    cache, now if not yet): numba's C wrapper of it, the one its first-class functions call."""
    cres = fn.get_compile_result(sig)
    return int(cres.library.get_pointer_to_function(cres.fndesc.llvm_cfunc_wrapper_name))


class _Listener(event.Listener):
    """Passes numba's outermost compile events on (a compile compiles its callees inside it)."""

    def __init__(self, on_start: Callable[[str, str | None], None], on_end: Callable[[str, float], None]) -> None:
        self.on_start_cb, self.on_end_cb = on_start, on_end
        self.depth = threading.local()
        self.t0 = 0.0

    def on_start(self, ev: event.Event) -> None:
        depth = getattr(self.depth, "n", 0)
        self.depth.n = depth + 1
        if depth == 0:
            self.t0 = time.perf_counter()
            fn = getattr((ev.data or {}).get("dispatcher"), "py_func", None)
            self.on_start_cb(_name(fn), _source(fn))

    def on_end(self, ev: event.Event) -> None:
        self.depth.n = getattr(self.depth, "n", 1) - 1
        if self.depth.n == 0:
            fn = getattr((ev.data or {}).get("dispatcher"), "py_func", None)
            self.on_end_cb(_name(fn), time.perf_counter() - self.t0)


def _name(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", "?"))


def _source(fn: Any) -> str | None:
    try:
        return inspect.getfile(fn)
    except TypeError:
        return None


@contextmanager
def watch_compiles(on_start: Callable[[str, str | None], None],
                   on_end: Callable[[str, float], None]) -> Iterator[None]:
    """Within the block, `on_start(name, source file)` before numba compiles a function its cache does not
    have, and `on_end(name, seconds)` after it (the outermost compile only: it compiles its callees inside
    it)."""
    listener = _Listener(on_start, on_end)
    event.register("numba:compile", listener)
    try:
        yield
    finally:
        event.unregister("numba:compile", listener)
