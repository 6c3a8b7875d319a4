"""Backends by name: `init_backend("cpu")`, later `"torch"`, `"torch:cuda:0"`.

A factory is registered under a base name (case-insensitive). A name with a
colon passes what follows the first colon to the factory as its one argument
("torch:cuda:0" calls the "torch" factory with "cuda:0"); a plain name calls
it with no argument. The CPU backend is registered here, imported lazily so
that this layer does not depend on the backends' packages.
"""

from __future__ import annotations

from collections.abc import Callable

from pyggml.backend.backend import Backend
from pyggml.core.errors import ArgumentError

BackendFactory = Callable[..., Backend]

_factories: dict[str, BackendFactory] = {}


def register_backend(name: str, factory: BackendFactory) -> None:
    """Make `init_backend(name)` call `factory()` (and `name:arg` call `factory(arg)`)."""
    key = name.lower()
    if not key or ":" in key:
        raise ArgumentError(f"register_backend: a backend name is non-empty and has no ':', got {name!r}")
    _factories[key] = factory


def unregister_backend(name: str) -> None:
    _factories.pop(name.lower(), None)


def list_backends() -> list[str]:
    """The registered base names, sorted."""
    return sorted(_factories)


def init_backend(name: str) -> Backend:
    """A new backend by name ("cpu", "CPU", "torch:cuda:0", ...)."""
    base, sep, arg = name.partition(":")
    factory = _factories.get(base.lower())
    if factory is None:
        raise ArgumentError(f"no backend named {name!r}; registered: {', '.join(list_backends()) or 'none'}")
    return factory(arg) if sep else factory()


def _cpu_factory(arg: str | None = None) -> Backend:
    from pyggml.backends.cpu import cpu_init

    if arg:
        raise ArgumentError(f"the CPU backend takes no argument, got 'cpu:{arg}'")
    return cpu_init()


def _torch_factory(arg: str | None = None) -> Backend:
    """"torch" (the cpu device) and "torch:<device>"; torch is imported only here, when asked for."""
    try:
        from pyggml.backends.torch import torch_init
    except ImportError as e:
        raise ArgumentError(f"the torch backend needs PyTorch (pip install pyggml[torch]): {e}") from None
    return torch_init(arg or "cpu")


register_backend("cpu", _cpu_factory)
register_backend("torch", _torch_factory)
