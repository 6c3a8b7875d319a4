"""Numba's compilation of the CPU kernels: where the compiled code is kept, stamped with every backend module a
kernel imports (it may inline them), who hears of a compile, a function's address (DESIGN.md, "Compiled kernels")."""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from numba.core import caching, event

from pyggml.cache import cache_dir

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
_BACKEND_ROOT = Path(__file__).resolve().parent
_CacheImpl: Any = getattr(caching, "CacheImpl", None) or caching._CacheImpl
_InTreeLocator: Any = getattr(caching, "InTreeCacheLocator", None) or caching._InTreeCacheLocator
_UserProvidedLocator: Any = (getattr(caching, "UserProvidedCacheLocator", None)
                             or caching._UserProvidedCacheLocator)


def kernel_cache_dir() -> Path:
    """Where pyggml's compiled kernels go when the package's own folder is read-only."""
    return cache_dir() / "numba"


def _in_package(py_file: str, root: Path = _PACKAGE_ROOT) -> bool:
    try:
        return Path(py_file).resolve().is_relative_to(root)
    except OSError:
        return False


def sources_stamp(py_file: str) -> bytes:
    """The hash of backend source `py_file` and every backend module it imports, directly or not."""
    files, todo = set(), [Path(py_file).resolve()]
    while todo:
        path = todo.pop()
        if path not in files:
            files.add(path)
            todo.extend(_backend_imports(path, *_size_time(path)))
    return _hash_sources(tuple((f, *_size_time(f)) for f in sorted(files)))


def _size_time(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=256)
def _backend_imports(path: Path, size: int, mtime_ns: int) -> tuple[Path, ...]:
    """The backend's source files `path` imports at module level."""
    package = _BACKEND_ROOT.parents[2]
    prefix = ".".join(_BACKEND_ROOT.relative_to(package).parts)
    names: list[str] = []
    for node in ast.parse(path.read_bytes()).body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names += [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    out = []
    for name in names:
        if name == prefix or name.startswith(prefix + "."):
            base = package.joinpath(*name.split("."))
            out += [p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()]
    return tuple(out)


@functools.lru_cache(maxsize=256)
def _hash_sources(files: tuple[tuple[Path, int, int], ...]) -> bytes:
    h = hashlib.sha256()
    for path, _, _ in files:
        h.update(path.relative_to(_BACKEND_ROOT).as_posix().encode())
        h.update(path.read_bytes())
    return h.digest()


class _BackendStamp:
    """A locator's source stamp: `sources_stamp` for a source of the CPU backend."""

    _py_file: str

    def get_source_stamp(self) -> Any:
        if _in_package(self._py_file, _BACKEND_ROOT):
            return sources_stamp(self._py_file)
        return super().get_source_stamp()  # type: ignore[misc]


class _BackendOnly(_BackendStamp):

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> Any:
        if not _in_package(py_file, _BACKEND_ROOT):
            return None
        return super().from_function(py_func, py_file)  # type: ignore[misc]


class BackendUserProvidedLocator(_BackendOnly, _UserProvidedLocator):
    """numba's NUMBA_CACHE_DIR locator with the backend's stamp."""


class BackendInTreeLocator(_BackendOnly, _InTreeLocator):
    """numba's locator beside the source (`__pycache__`) with the backend's stamp."""


class PackageCacheLocator(_BackendStamp, caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
    """numba's cache locator for pyggml's own sources, in `kernel_cache_dir()`."""

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
    """Put the backend's locators before the numba ones they stamp anew, then PackageCacheLocator."""
    locators: list[Any] = _CacheImpl._locator_classes
    if PackageCacheLocator in locators:
        return
    for ours, theirs in ((BackendUserProvidedLocator, _UserProvidedLocator), (BackendInTreeLocator, _InTreeLocator)):
        locators.insert(locators.index(theirs) if theirs in locators else 0, ours)
    at = locators.index(_InTreeLocator) + 1 if _InTreeLocator in locators else len(locators)
    locators.insert(at, PackageCacheLocator)


def cache_folder(source: str) -> str | None:
    """The folder of the first locator numba would take for the functions of `source`, or None."""
    for cls in _CacheImpl._locator_classes:
        locator = cls.from_function(_probe, source)  # a locator reads only the function's first line number
        if locator is not None:
            return str(locator.get_cache_path())
    return None


def _probe() -> None:
    """cache_folder's probe."""


def compiled_address(fn: Any, sig: Any) -> int:
    """The C-callable address (numba's cfunc wrapper) of dispatcher `fn` compiled for `sig`, compiled if not yet."""
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
    """Within the block, `on_start(name, source file)` and `on_end(name, seconds)` around each outermost compile."""
    listener = _Listener(on_start, on_end)
    event.register("numba:compile", listener)
    try:
        yield
    finally:
        event.unregister("numba:compile", listener)
