"""The torch backend's matmul precision: the "auto" rule on fake capabilities, the option's sources, its display."""

from __future__ import annotations

import pytest
import torch

from pyggml.backends.torch import (
    ENV_MATMUL_PRECISION,
    DeviceCaps,
    TorchBackend,
    default_matmul_precision,
    parse_spec,
    probe_caps,
    torch_init,
)
from pyggml.backends.torch.precision import resolve_matmul_precision
from pyggml.core.errors import ArgumentError, ArgumentTypeError
from pyggml.ggml_backend import init_backend

AMX_CPU = DeviceCaps("cpu", amx=True, avx512_bf16=True)  # Intel Sapphire Rapids and later
ZEN4_CPU = DeviceCaps("cpu", avx512_bf16=True)  # AMD with AVX512-BF16, no AMX
AVX2_CPU = DeviceCaps("cpu")  # neither
CUDA = DeviceCaps("cuda")


@pytest.fixture(autouse=True)
def _no_env_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests set the variable themselves where they need it (CI may run the suite with it set)."""
    monkeypatch.delenv(ENV_MATMUL_PRECISION, raising=False)


@pytest.mark.parametrize("caps, want", [
    (AMX_CPU, "bf16"),
    (DeviceCaps("cpu", amx=True), "bf16"),
    (ZEN4_CPU, "bf16"),
    (AVX2_CPU, "f32"),
    (DeviceCaps("cpu", amx_fp16=True), "f16"),
    (DeviceCaps("cpu", amx=True, avx512_bf16=True, amx_fp16=True), "bf16"),  # bf16 first: f32's range
    (CUDA, "f16"),
])
def test_auto_rule_on_fake_capabilities(caps: DeviceCaps, want: str) -> None:
    assert default_matmul_precision(caps) == want
    precision, source = resolve_matmul_precision("auto", caps, environ={})
    assert precision == want and source == f"auto: {caps.describe()}"


def test_probe_reads_torch_cpu_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend's default follows torch's CPU flags, whatever this machine has: each CPU kind simulated."""
    for amx, avx512_bf16, want in ((True, True, "bf16"), (False, True, "bf16"), (False, False, "f32")):
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_fp16_supported", lambda: False, raising=False)
        assert probe_caps(torch.device("cpu")) == DeviceCaps("cpu", amx=amx, avx512_bf16=avx512_bf16)
        tb = torch_init()
        assert tb.matmul_precision == want and tb.matmul_dtype == {"bf16": torch.bfloat16, "f32": torch.float32}[want]
    assert tb.describe() == "matmul precision f32 (auto: cpu without bf16/f16 matrix units)"
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert torch_init().describe() == "matmul precision bf16 (auto: cpu with amx)"


def test_probe_survives_missing_or_failing_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    def fails() -> bool:
        raise RuntimeError("cpuinfo failed")

    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", fails, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_fp16_supported", lambda: False, raising=False)
    assert probe_caps(torch.device("cpu")) == AVX2_CPU


def test_backend_default_is_the_rule_for_this_machine() -> None:
    tb = torch_init()
    assert tb.matmul_precision == default_matmul_precision(probe_caps(tb.device))
    assert tb.describe().startswith(f"matmul precision {tb.matmul_precision} (auto: cpu")


@pytest.mark.parametrize("precision", ["f32", "f16", "bf16", "F32", " BF16 "])
def test_explicit_precision_wins_over_the_machine_and_the_environment(precision: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    want = precision.strip().lower()
    other = "f16" if want != "f16" else "bf16"
    monkeypatch.setenv(ENV_MATMUL_PRECISION, other)
    tb = TorchBackend(matmul_precision=precision)
    assert tb.matmul_precision == want
    assert tb.describe() == f"matmul precision {want} (from the matmul_precision option)"
    assert tb.half_is_fast(torch.bfloat16) == (want == "bf16")
    assert tb.half_is_fast(torch.float16) == (want == "f16")
    assert not tb.half_is_fast(torch.float32)


def test_environment_sets_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ("f32", "f16", "bf16"):
        monkeypatch.setenv(ENV_MATMUL_PRECISION, value)
        tb = torch_init()
        assert tb.matmul_precision == value
        assert tb.describe() == f"matmul precision {value} (from {ENV_MATMUL_PRECISION})"
        assert init_backend("torch").matmul_precision == value  # type: ignore[attr-defined]
    for value in ("", "  ", "auto"):  # unset, empty or auto: the machine's rule
        monkeypatch.setenv(ENV_MATMUL_PRECISION, value)
        assert torch_init().describe().startswith("matmul precision ") and "(auto: cpu" in torch_init().describe()
    assert resolve_matmul_precision(None, ZEN4_CPU, environ={ENV_MATMUL_PRECISION: "auto"})[0] == "bf16"
    assert resolve_matmul_precision(None, AVX2_CPU, environ={})[0] == "f32"
    assert resolve_matmul_precision(None, AVX2_CPU, environ={ENV_MATMUL_PRECISION: "BF16"}) == (
        "bf16", f"from {ENV_MATMUL_PRECISION}")


def test_bad_environment_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_MATMUL_PRECISION, "fp8")
    with pytest.raises(ArgumentError, match=f"{ENV_MATMUL_PRECISION} 'fp8' is not a matmul precision; "
                                            "allowed: auto, f32, f16, bf16"):
        torch_init()
    assert torch_init(matmul_precision="f32").matmul_precision == "f32"  # an explicit value does not read it


@pytest.mark.parametrize("spec, device, options", [
    ("cpu", "cpu", {}),
    ("cpu,matmul_precision=bf16", "cpu", {"matmul_precision": "bf16"}),
    ("cuda:1, matmul_precision=f16", "cuda:1", {"matmul_precision": "f16"}),
    (",matmul_precision=f32", "cpu", {"matmul_precision": "f32"}),
])
def test_parse_spec(spec: str, device: str, options: dict[str, str]) -> None:
    assert parse_spec(spec) == (device, options)


@pytest.mark.parametrize("precision", ["f32", "f16", "bf16"])
def test_registry_spec_carries_the_precision(precision: str) -> None:
    tb = init_backend(f"torch:cpu,matmul_precision={precision}")
    assert isinstance(tb, TorchBackend) and tb.name() == "Torch(cpu)" and tb.matmul_precision == precision


@pytest.mark.parametrize("spec, fragments", [
    ("cpu,precision=f32", ("unknown option 'precision'", "keys: matmul_precision")),
    ("cpu,bf16", ("option 'bf16'", "is not key=value")),
    ("cpu,matmul_precision=f32,matmul_precision=bf16", ("'matmul_precision' is given twice",)),
    ("cpu,matmul_precision=f8", ("matmul_precision 'f8' is not a matmul precision", "allowed: auto, f32, f16, bf16")),
])
def test_bad_specs(spec: str, fragments: tuple[str, ...]) -> None:
    with pytest.raises(ArgumentError) as info:
        torch_init(spec)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_precision_given_twice_is_refused() -> None:
    with pytest.raises(ArgumentError, match="both in the device spec \\('f16'\\) and as an argument \\('bf16'\\)"):
        torch_init("cpu,matmul_precision=f16", matmul_precision="bf16")


def test_wrong_type_of_precision() -> None:
    with pytest.raises(ArgumentTypeError, match="matmul_precision \\(auto, f32, f16, bf16\\) must be a str, got dtype"):
        torch_init(matmul_precision=torch.bfloat16)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="must be a str, got int 16"):
        torch_init(matmul_precision=16)  # type: ignore[arg-type]


def test_precision_is_read_only() -> None:
    tb = torch_init(matmul_precision="f32")
    with pytest.raises(AttributeError):
        tb.matmul_precision = "bf16"  # type: ignore[misc]
    assert tb.matmul_precision == "f32"


@pytest.mark.slow
def test_run_verbose_shows_each_torch_backends_precision(capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from pyggml.cli.main import main

    monkeypatch.setenv(ENV_MATMUL_PRECISION, "f16")
    code = main(["run", "-n", "2", "--temp", "0", "-v", "--backend", "torch:cpu,matmul_precision=f32",
                 "--backend", "torch", "--backend", "cpu", "--n-layers-on", "torch:cpu,matmul_precision=f32=1",
                 "--n-layers-on", "torch=1"])
    err = capsys.readouterr().err
    assert code == 0, err
    lines = err.splitlines()
    assert "Torch(cpu)#0: matmul precision f32 (from the matmul_precision option)" in lines
    assert f"Torch(cpu)#1: matmul precision f16 (from {ENV_MATMUL_PRECISION})" in lines
    assert not any(line.startswith("CPU#2:") for line in lines)  # the CPU backend has no such choice
