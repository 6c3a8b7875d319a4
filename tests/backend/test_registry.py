"""The registry of backends: registries, devices, lookups by name and type, backend specs, load().

Each test that registers something works on a copy of the registry's state (`isolated`), so the
process-wide registry is as it was afterwards.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from tiny_backend import REG_MODULE, TinyDevice

from pyggml.backends.cpu import CPUBackend, cpu_device, cpu_init, cpu_reg
from pyggml.core.errors import ArgumentError, ArgumentTypeError, OutOfBoundsError
from pyggml.ggml_backend import (
    Backend,
    Device,
    DeviceType,
    Reg,
    dev_by_name,
    dev_by_type,
    dev_count,
    dev_get,
    devices,
    init_backend,
    init_best,
    init_by_name,
    init_by_type,
    list_backends,
    load,
    reg_by_name,
    reg_count,
    reg_get,
    register,
    registry,
    regs,
    set_n_threads,
)


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry's state copied, restored after the test."""
    monkeypatch.setattr(registry, "_regs", dict(registry._regs))
    monkeypatch.setattr(registry, "_devices", list(registry._devices))
    monkeypatch.setattr(registry, "_entry_points", registry._entry_points)
    monkeypatch.setattr(registry, "_load_errors", dict(registry._load_errors))


class TinyReg(Reg):
    def __init__(self, name: str = "tiny", n: int = 2) -> None:
        super().__init__()
        self._name = name
        self._devices = [TinyDevice() for _ in range(n)]
        for d in self._devices:
            d.reg = self

    def _get_name(self) -> str:
        return self._name

    def _get_device_count(self) -> int:
        return len(self._devices)

    def _get_device(self, index: int) -> Device:
        return self._devices[index]


def test_cpu_is_found_by_name_type_and_index() -> None:
    assert "cpu" in list_backends()
    reg = reg_by_name("CPU")
    assert reg is cpu_reg() and reg.name() == "CPU" and reg.dev_count() == 1 and reg.dev_get(0) is cpu_device()
    assert dev_by_name("cpu") is cpu_device() and dev_by_type(DeviceType.CPU) is cpu_device()
    assert cpu_device() in devices() and dev_count() == len(devices()) and reg in regs() and reg_count() == len(regs())
    assert dev_get(devices().index(cpu_device())) is cpu_device() and reg_get(regs().index(reg)) is reg
    for backend in (init_by_name("CPU"), init_by_type(DeviceType.CPU), init_backend("cpu"), init_backend("CPU")):
        assert isinstance(backend, CPUBackend) and backend.get_device() is cpu_device()
    assert isinstance(init_best(), Backend)  # a GPU where there is one, else the CPU


def test_lookups_check_their_arguments() -> None:
    with pytest.raises(OutOfBoundsError, match=r"dev_get: index 1000 is out of range \(\d+ devices\)"):
        dev_get(1000)
    with pytest.raises(OutOfBoundsError, match="reg_get: index -1 is out of range"):
        reg_get(-1)
    with pytest.raises(OutOfBoundsError, match="registry 'CPU': device index 1 is out of range"):
        cpu_reg().dev_get(1)
    with pytest.raises(ArgumentError, match="dev_by_type: 9 is not a device type"):
        dev_by_type(9)
    with pytest.raises(ArgumentTypeError):
        reg_by_name(3)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="init_by_name: no device named 'vulkan0'"):
        init_by_name("vulkan0")
    with pytest.raises(ArgumentError, match="the CPU backend takes no argument, got 'cpu:1'"):
        init_backend("cpu:1")
    with pytest.raises(ArgumentError, match="the CPU backend takes no parameters, got 'x=1'"):
        cpu_device().init_backend("x=1")
    assert reg_by_name("vulkan") is None and dev_by_name("vulkan0") is None


def test_a_registry_makes_backends_of_its_devices_by_spec(isolated: None) -> None:
    reg = TinyReg()
    register(reg)
    assert "tiny" in list_backends() and reg_by_name("TINY") is reg
    first, second = reg.devices()
    assert init_backend("tiny").get_device() is first  # no ARG: the first device
    assert init_backend("tiny:Tiny,anything").get_device() is first  # ARG: a device by name, then its params
    with pytest.raises(ArgumentError, match="backend 'tiny' has no device named 'gpu7' \\(devices: Tiny, Tiny\\)"):
        init_backend("tiny:gpu7")
    assert all(d in devices() for d in (first, second))
    registry.unload(reg)
    assert reg_by_name("tiny") is None and first not in devices()


def test_a_registry_of_another_api_version_is_refused(isolated: None, tmp_path: Path) -> None:
    (tmp_path / "old_backend.py").write_text(textwrap.dedent("""
        from pyggml.ggml_backend import Reg

        class Old(Reg):
            api_version = 1

            def _get_name(self):
                return "old"

        def ggml_backend_init():
            return Old()
    """))
    with pytest.raises(ArgumentError, match="registry 'old' has API version 1, pyggml's is 2"):
        load(tmp_path / "old_backend.py")


def test_device_register(isolated: None) -> None:
    dev = TinyDevice()
    registry.device_register(dev)
    registry.device_register(dev)  # once
    assert devices().count(dev) == 1 and dev_by_type(DeviceType.ACCEL) is not None


def test_set_n_threads_through_the_registry() -> None:
    cpu = cpu_init()
    assert set_n_threads(cpu, 3) and cpu.n_threads == 3
    assert not set_n_threads(TinyDevice().init_backend(), 3)  # its registry has no such function
    assert cpu_reg().get_proc_address("ggml_backend_set_n_threads") is not None
    assert cpu_reg().get_proc_address("ggml_backend_nothing") is None
    with pytest.raises(ArgumentError, match="n_threads must be >= 1"):
        set_n_threads(cpu, 0)


# --- load (ggml_backend_load) ---


MODULE = REG_MODULE


def test_load_a_py_file_a_package_and_a_module(isolated: None, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file_backend.py").write_text(MODULE.format(name="fromfile"))
    (tmp_path / "pkg_backend").mkdir()
    (tmp_path / "pkg_backend" / "__init__.py").write_text(MODULE.format(name="frompkg"))
    (tmp_path / "mod_backend.py").write_text(MODULE.format(name="frommod") + "\nreg = ggml_backend_init()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec, name in ((str(tmp_path / "file_backend.py"), "fromfile"), (tmp_path / "pkg_backend", "frompkg"),
                       ("mod_backend", "frommod"), ("mod_backend:reg", "frommod")):
        reg = load(spec)
        assert reg.name() == name and reg_by_name(name) is reg
        assert init_backend(name).get_device() is reg.dev_get(0)


def test_load_errors_name_what_is_wrong(isolated: None, tmp_path: Path) -> None:
    with pytest.raises(ArgumentError, match="load: no such file or directory"):
        load(tmp_path / "nothing.py")
    (tmp_path / "empty_backend.py").write_text("x = 1\n")
    with pytest.raises(ArgumentError, match="has no 'ggml_backend_init'"):
        load(str(tmp_path / "empty_backend.py"))
    (tmp_path / "wrong_backend.py").write_text("def ggml_backend_init():\n    return 42\n")
    with pytest.raises(ArgumentError, match="gives int 42, not a pyggml.ggml_backend.registry.Reg"):
        load(str(tmp_path / "wrong_backend.py"))
    (tmp_path / "scored_backend.py").write_text("def ggml_backend_score():\n    return 0\n")
    with pytest.raises(ArgumentError, match="not supported on this system"):
        load(str(tmp_path / "scored_backend.py"))
    (tmp_path / "notapkg").mkdir()
    with pytest.raises(ArgumentError, match="is not a package"):
        load(tmp_path / "notapkg")
    with pytest.raises(ArgumentError, match="cannot import backend module 'no_such_module_here'"):
        load("no_such_module_here")
    with pytest.raises(ArgumentTypeError):
        load(42)  # type: ignore[arg-type]
