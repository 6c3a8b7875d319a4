"""`Reg` (ggml_backend_reg, ggml-backend-impl.h) and the registry of them (ggml-backend-reg.cpp).

Registries come from the entry-point group `pyggml.backends` (a `Reg` or a callable returning one); an entry
point is imported only when its name is asked for or the registries are enumerated, so `init_backend("cpu")`
does not import torch.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pyggml.core.checks import check_instance, check_int
from pyggml.core.errors import ArgumentError, ArgumentTypeError, OutOfBoundsError
from pyggml.ggml_backend.backend import Backend
from pyggml.ggml_backend.buffer_type import BufferType
from pyggml.ggml_backend.device import Device, DeviceType

log = logging.getLogger("pyggml.ggml_backend")

ENTRY_POINT_GROUP = "pyggml.backends"
GGML_BACKEND_API_VERSION = 2  # ggml-backend-impl.h's; a registry with another version is refused
SET_N_THREADS = "ggml_backend_set_n_threads"
EXTRA_BUFTS = "ggml_backend_dev_get_extra_bufts"
# pyggml's own: no ggml backend has a batch-invariant switch
SET_BATCH_INVARIANT = "pyggml_backend_set_batch_invariant"
# a registry compiling kernels at run time: a context manager calling on_start(name, source) and
# on_end(name, seconds) around each compile, and the folder compiled code is kept in
WATCH_COMPILES = "pyggml_watch_compiles"
COMPILE_CACHE_FOLDER = "pyggml_compile_cache_folder"

BackendFactory = Callable[..., Backend]


class Reg:
    """A backend's registry of devices. Subclasses implement the hooks; users call the public methods."""

    api_version = GGML_BACKEND_API_VERSION

    def __init__(self, context: Any = None) -> None:
        self.context = context

    def _get_name(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} must implement _get_name")

    def _get_device_count(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must implement _get_device_count")

    def _get_device(self, index: int) -> Device:
        raise NotImplementedError(f"{type(self).__name__} must implement _get_device")

    def _get_proc_address(self, name: str) -> Callable[..., Any] | None:
        return None

    def _init_backend(self, arg: str | None) -> Backend:
        """A backend for "NAME:ARG"; by default ARG is "DEVICE[,PARAMS]" (None: the first device)."""
        devices = self.devices()
        if arg is None:
            if not devices:
                raise ArgumentError(f"backend '{self.name()}' has no devices")
            return devices[0].init_backend(None)
        dev_name, sep, params = arg.partition(",")
        for dev in devices:
            if dev.name().lower() == dev_name.lower():
                return dev.init_backend(params if sep else None)
        names = ", ".join(dev.name() for dev in devices) or "none"
        raise ArgumentError(f"backend '{self.name()}' has no device named {dev_name!r} (devices: {names})")

    def name(self) -> str:
        return self._get_name()

    def dev_count(self) -> int:
        return check_int(self._get_device_count(), f"registry '{self.name()}': device count", minimum=0)

    def dev_get(self, index: int) -> Device:
        """ggml_backend_reg_dev_get: device `index` (OutOfBoundsError outside 0..dev_count() - 1)."""
        index = check_int(index, f"registry '{self.name()}': dev_get: index")
        count = self.dev_count()
        if not 0 <= index < count:
            raise OutOfBoundsError(f"registry '{self.name()}': device index {index} is out of range "
                                   f"({count} devices)")
        device = self._get_device(index)
        check_instance(device, Device, f"registry '{self.name()}': device {index}")
        return device

    def devices(self) -> list[Device]:
        return [self.dev_get(i) for i in range(self.dev_count())]

    def get_proc_address(self, name: str) -> Callable[..., Any] | None:
        check_instance(name, str, f"registry '{self.name()}': get_proc_address: name")
        return self._get_proc_address(name)

    def init_backend(self, arg: str | None = None) -> Backend:
        if arg is not None:
            check_instance(arg, str, f"registry '{self.name()}': init_backend: arg")
        backend = self._init_backend(arg)
        check_instance(backend, Backend, f"registry '{self.name()}': init_backend's result")
        return backend

    def __repr__(self) -> str:
        return f"{type(self).__name__}('{self.name()}')"


class FactoryReg(Reg):
    """`register_backend`'s registry: no devices; `init_backend(arg)` calls `factory(arg)` (or `factory()`)."""

    def __init__(self, name: str, factory: BackendFactory) -> None:
        super().__init__()
        self._name = name
        self.factory = factory

    def _get_name(self) -> str:
        return self._name

    def _get_device_count(self) -> int:
        return 0

    def _init_backend(self, arg: str | None) -> Backend:
        return self.factory(arg) if arg is not None else self.factory()


_regs: dict[str, Reg] = {}
_devices: list[Device] = []  # ggml_backend_device_register's
_entry_points: dict[str, importlib.metadata.EntryPoint] | None = None
_load_errors: dict[str, str] = {}


def _key(name: str) -> str:
    return name.lower()


def _scan_entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """The group's entry points by lower-case name (the first of a name wins), remembered.
    Every distribution is read: a stale `*.egg-info` first on sys.path would hide the installed metadata."""
    global _entry_points
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for dist in importlib.metadata.distributions():
        for ep in dist.entry_points:
            if ep.group != ENTRY_POINT_GROUP:
                continue
            key = _key(ep.name)
            if key in found and found[key].value != ep.value:
                log.warning("backend entry point %s = %s is ignored: %s = %s came first", ep.name, ep.value,
                            found[key].name, found[key].value)
                continue
            found.setdefault(key, ep)
    _entry_points = dict(sorted(found.items()))
    return _entry_points


def _known_entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    return _entry_points if _entry_points is not None else _scan_entry_points()


def _as_reg(obj: object, where: str) -> Reg:
    """A registry from what an entry point or a module names: a Reg, or a callable returning one."""
    if not isinstance(obj, Reg) and callable(obj):
        obj = obj()
    if not isinstance(obj, Reg):
        raise ArgumentError(f"{where} gives {type(obj).__name__} {obj!r:.80}, not a pyggml.ggml_backend.registry.Reg "
                            f"(or a function returning one)")
    if obj.api_version != GGML_BACKEND_API_VERSION:
        raise ArgumentError(f"{where}: registry '{obj.name()}' has API version {obj.api_version}, pyggml's is "
                            f"{GGML_BACKEND_API_VERSION}")
    return obj


def _load_entry_point(key: str, ep: importlib.metadata.EntryPoint) -> Reg:
    where = f"backend '{ep.name}' (entry point {ep.value}"
    where += f" of {ep.dist.name})" if ep.dist is not None else ")"
    try:
        obj = ep.load()
    except Exception as e:  # an import can fail in any way: reported, the lookup goes on
        _load_errors[key] = f"{type(e).__name__}: {e}"
        raise ArgumentError(f"{where} cannot be loaded: {type(e).__name__}: {e}") from e
    reg = _as_reg(obj, where)
    _regs[key] = reg
    _load_errors.pop(key, None)
    log.debug("loaded backend %s from entry point %s", reg.name(), ep.value)
    return reg


def loaded_regs() -> list[Reg]:
    """The registries registered or loaded so far (no entry point is loaded for this)."""
    return list(_regs.values())


def _iter_regs() -> Iterator[Reg]:
    """The registries in order, each entry point loaded when the walk reaches it; failures go to `load_errors`."""
    yield from list(_regs.values())
    for key, ep in list(_known_entry_points().items()):
        if key in _regs or key in _load_errors:
            continue
        try:
            yield _load_entry_point(key, ep)
        except ArgumentError as e:
            log.info("%s", e)


def _iter_devices() -> Iterator[Device]:
    """Every device in order: each registry's, then those registered on their own."""
    seen: list[Device] = []
    for reg in _iter_regs():
        for dev in reg.devices():
            seen.append(dev)
            yield dev
    for dev in list(_devices):
        if all(d is not dev for d in seen):
            yield dev


def load_errors() -> dict[str, str]:
    return dict(_load_errors)


def register(reg: Reg) -> None:
    """ggml_backend_register: add `reg` under its name (replacing a registry of the same name)."""
    check_instance(reg, Reg, "register: reg")
    _regs[_key(reg.name())] = reg


def device_register(device: Device) -> None:
    check_instance(device, Device, "device_register: device")
    if all(d is not device for d in _devices):
        _devices.append(device)


def unload(reg: Reg) -> None:
    """ggml_backend_unload: forget `reg` (an entry point of the same name is found again when asked for)."""
    check_instance(reg, Reg, "unload: reg")
    for key, r in list(_regs.items()):
        if r is reg:
            del _regs[key]


def reg_by_name(name: str) -> Reg | None:
    """ggml_backend_reg_by_name (case-insensitive), or None; ArgumentError if its entry point fails to load."""
    check_instance(name, str, "reg_by_name: name")
    key = _key(name)
    reg = _regs.get(key)
    if reg is not None:
        return reg
    ep = _known_entry_points().get(key)
    if ep is None:
        ep = _scan_entry_points().get(key)
    if ep is not None:
        return _load_entry_point(key, ep)
    for reg in _regs.values():
        if _key(reg.name()) == key:
            return reg
    return None


def regs() -> list[Reg]:
    return list(_iter_regs())


def reg_count() -> int:
    return len(regs())


def reg_get(index: int) -> Reg:
    """ggml_backend_reg_get: registry `index` (OutOfBoundsError outside 0..reg_count() - 1)."""
    index = check_int(index, "reg_get: index")
    all_regs = regs()
    if not 0 <= index < len(all_regs):
        raise OutOfBoundsError(f"reg_get: index {index} is out of range ({len(all_regs)} registries)")
    return all_regs[index]


def devices() -> list[Device]:
    return list(_iter_devices())


def dev_count() -> int:
    return len(devices())


def dev_get(index: int) -> Device:
    """ggml_backend_dev_get: device `index` (OutOfBoundsError outside 0..dev_count() - 1)."""
    index = check_int(index, "dev_get: index")
    all_devices = devices()
    if not 0 <= index < len(all_devices):
        raise OutOfBoundsError(f"dev_get: index {index} is out of range ({len(all_devices)} devices)")
    return all_devices[index]


def dev_by_name(name: str) -> Device | None:
    """ggml_backend_dev_by_name: the first device named `name` (case-insensitive), or None."""
    check_instance(name, str, "dev_by_name: name")
    for dev in _iter_devices():
        if _key(dev.name()) == _key(name):
            return dev
    return None


def dev_by_type(type: DeviceType | int) -> Device | None:
    check_int(type, "dev_by_type: type")
    try:
        want = DeviceType(type)
    except ValueError:
        raise ArgumentError(f"dev_by_type: {type} is not a device type "
                            f"({', '.join(f'{t.name} = {t.value}' for t in DeviceType)})") from None
    for dev in _iter_devices():
        if dev.type() == want:
            return dev
    return None


def init_by_name(name: str, params: str | None = None) -> Backend:
    """ggml_backend_init_by_name: a backend of the device named `name` (ArgumentError if there is none)."""
    dev = dev_by_name(name)
    if dev is None:
        names = ", ".join(d.name() for d in devices()) or "none"
        raise ArgumentError(f"init_by_name: no device named {name!r} (devices: {names})")
    return dev.init_backend(params)


def init_by_type(type: DeviceType | int, params: str | None = None) -> Backend:
    """ggml_backend_init_by_type: a backend of the first device of `type` (ArgumentError if there is none)."""
    dev = dev_by_type(type)
    if dev is None:
        raise ArgumentError(f"init_by_type: no device of type {DeviceType(type).name}")
    return dev.init_backend(params)


def init_best() -> Backend:
    """ggml_backend_init_best: a backend of the first GPU, else integrated GPU, else CPU device."""
    for type in (DeviceType.GPU, DeviceType.IGPU, DeviceType.CPU):
        dev = dev_by_type(type)
        if dev is not None:
            return dev.init_backend(None)
    raise ArgumentError("init_best: no GPU, integrated GPU or CPU device is registered")


def load(path_or_module: str | Path) -> Reg:
    """ggml_backend_load: the registry of a module ("pkg.mod", "pkg.mod:obj", a `.py` file or a package folder)
    from its `ggml_backend_init()`; a `ggml_backend_score()` of 0 raises ArgumentError."""
    if not isinstance(path_or_module, (str, Path)):
        raise ArgumentTypeError(f"load: path_or_module must be a str or a Path, got "
                                f"{type(path_or_module).__name__} {path_or_module!r:.80}")
    text = str(path_or_module)
    path = Path(text)
    if isinstance(path_or_module, Path) or path.suffix == ".py" or path.is_dir():
        module = _import_path(path)
        attr = "ggml_backend_init"
    else:
        name, _, attr = text.partition(":")
        attr = attr or "ggml_backend_init"
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            raise ArgumentError(f"load: cannot import backend module {name!r}: {e}") from None
    score = getattr(module, "ggml_backend_score", None)
    if callable(score) and score() == 0:
        raise ArgumentError(f"load: backend {text!r} is not supported on this system (ggml_backend_score is 0)")
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ArgumentError(f"load: {text!r} has no {attr!r} (a function returning the backend's Reg)")
        obj = getattr(obj, part)
    reg = _as_reg(obj, f"load: {text!r}")
    register(reg)
    log.info("loaded backend %s from %s", reg.name(), text)
    return reg


def _import_path(path: Path) -> Any:
    """The module of a `.py` file or a package directory, imported under a name of its own."""
    if not path.exists():
        raise ArgumentError(f"load: no such file or directory: '{path}'")
    if path.is_dir():
        init = path / "__init__.py"
        if not init.is_file():
            raise ArgumentError(f"load: directory '{path}' is not a package (it has no __init__.py)")
        spec = importlib.util.spec_from_file_location(path.name, init, submodule_search_locations=[str(path)])
        name = path.name
    else:
        name = f"pyggml_backend_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ArgumentError(f"load: cannot import '{path}'")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_all() -> None:
    """ggml_backend_load_all: look for entry points again (packages installed since) and load each one."""
    _scan_entry_points()
    _load_errors.clear()
    regs()


def register_backend(name: str, factory: BackendFactory) -> None:
    """Make `init_backend(name[:arg])` call `factory([arg])`, hiding an entry point of that name."""
    check_instance(name, str, "register_backend: name")
    key = _key(name)
    if not key or ":" in key:
        raise ArgumentError(f"register_backend: a backend name is non-empty and has no ':', got {name!r}")
    if not callable(factory):
        raise ArgumentTypeError(f"register_backend: factory must be callable, got {type(factory).__name__}")
    _regs[key] = FactoryReg(name, factory)


def unregister_backend(name: str) -> None:
    _regs.pop(_key(name), None)


def list_backends() -> list[str]:
    """The backend names, sorted: the registries' and the entry points' (none of them loaded for this)."""
    return sorted(set(_regs) | set(_known_entry_points()))


def init_backend(spec: str) -> Backend:
    """A backend for "NAME[:ARG]" ("cpu", "torch:cuda:0,matmul_precision=f32"): registry NAME makes it from ARG."""
    check_instance(spec, str, "init_backend: name")
    base, sep, arg = spec.partition(":")
    reg = reg_by_name(base)
    if reg is None:
        raise ArgumentError(f"no backend named {spec!r}; registered: {', '.join(list_backends()) or 'none'}")
    return reg.init_backend(arg if sep else None)


def set_n_threads(backend: Backend, n_threads: int) -> bool:
    """Set `backend`'s thread count through "ggml_backend_set_n_threads", as llama.cpp does; False if none."""
    check_instance(backend, Backend, "set_n_threads: backend")
    device = backend.get_device()
    reg = device.backend_reg() if device is not None else None
    fn = reg.get_proc_address(SET_N_THREADS) if reg is not None else None
    if fn is None:
        return False
    fn(backend, n_threads)
    return True


def set_batch_invariant(backend: Backend, on: bool) -> bool:
    """Make `backend` reduce each output element in one order whatever its batch (results independent of the
    other sequences); False where it has no "pyggml_backend_set_batch_invariant"."""
    check_instance(backend, Backend, "set_batch_invariant: backend")
    device = backend.get_device()
    reg = device.backend_reg() if device is not None else None
    fn = reg.get_proc_address(SET_BATCH_INVARIANT) if reg is not None else None
    if fn is None:
        return False
    fn(backend, on)
    return True


def dev_extra_bufts(device: Device) -> list[BufferType]:
    """A device's extra buffer types (the CPU's CPU_REPACK) through "ggml_backend_dev_get_extra_bufts", or []."""
    reg = device.backend_reg()
    fn = reg.get_proc_address(EXTRA_BUFTS) if reg is not None else None
    return list(fn(device)) if fn is not None else []
