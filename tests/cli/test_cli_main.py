"""The command line as a whole: --help of every subcommand, bad options, bad paths and corrupt files
end in one line on stderr with a non-zero exit code, --debug shows the exception."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_util import one_line

from pyggml.cli._common import CLIError, backend_plan
from pyggml.cli.main import main
from pyggml.core.errors import GGUFError

SUBCOMMANDS = ["run", "info", "bench", "test-ops", "devices"]


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: pyggml {command}")
    assert "--debug" in out


@pytest.mark.parametrize("command", [[], ["run", "--help"], ["chat", "--help"], ["serve", "--help"],
                                     ["bench", "--help"]])
def test_help_says_gguf_model_with_every_family(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """The model is a GGUF file of any architecture pyggml.models runs, not a LLaMA."""
    from pyggml.models.arch import ARCHS

    try:
        main(command)
    except SystemExit as e:
        assert e.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert f"GGUF model ({', '.join(ARCHS)})" in out and "LLaMA" not in out


def test_top_level_help_lists_the_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    for command in SUBCOMMANDS:
        assert command in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from pyggml import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == __version__


@pytest.mark.parametrize("argv, words", [
    (["run", "--bogus"], "pyggml run: error: unrecognized arguments: --bogus (see 'pyggml run --help')"),
    (["run", "-n", "many"], "invalid int value: 'many'"),
    (["run", "-n", "-3"], "must be >= -1, got -3"),  # -1: no limit, as llama.cpp's
    (["bench", "m.gguf", "-r", "0"], "must be >= 1"),
    (["info"], "the following arguments are required: MODEL.gguf"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_bad_option_is_one_line_and_exit_2(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    captured = capsys.readouterr()
    line = one_line(captured.err)
    assert words in line
    assert line.startswith("pyggml")
    assert captured.out == ""


@pytest.mark.parametrize("command", ["run", "info", "bench"])
def test_missing_file(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nothing.gguf"
    assert main([command, str(path)]) == 1
    line = one_line(capsys.readouterr().err)
    assert line == f"pyggml {command}: error: no such file: '{path}'"


def test_directory_is_not_a_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(tmp_path)]) == 1
    assert "is a directory" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("command", ["run", "info", "bench"])
def test_not_a_gguf_file(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "text.gguf"
    path.write_text("hello, this is not a model file at all\n" * 4)
    assert main([command, str(path)]) == 1
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"pyggml {command}: error: ")
    assert "is not a GGUF file" in line


@pytest.mark.parametrize("command", ["run", "info"])
def test_truncated_file(command: str, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tiny_model.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: len(data) * 2 // 3])
    assert main([command, str(path)]) == 1
    line = one_line(capsys.readouterr().err)
    assert "truncated" in line and "cut.gguf" in line


def test_corrupt_header(tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = bytearray(tiny_model.read_bytes())
    data[8:16] = (10**12).to_bytes(8, "little")  # n_tensors: far more than the file can hold
    path = tmp_path / "bad.gguf"
    path.write_bytes(bytes(data))
    assert main(["info", str(path)]) == 1
    assert "bad.gguf" in one_line(capsys.readouterr().err)


def test_debug_shows_the_exception(tmp_path: Path) -> None:
    path = tmp_path / "text.gguf"
    path.write_text("not gguf" * 10)
    with pytest.raises(GGUFError, match="is not a GGUF file"):
        main(["info", str(path), "--debug"])
    with pytest.raises(GGUFError):
        main(["--debug", "info", str(path)])
    with pytest.raises(CLIError, match="no such file"):
        main(["run", str(tmp_path / "none.gguf"), "--debug"])


def test_unknown_backend(tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(tiny_model), "--backend", "vulkan", "-n", "1"]) == 1
    line = one_line(capsys.readouterr().err)
    assert "vulkan" in line and "cpu" in line  # names the bad one and the registered ones


@pytest.mark.parametrize("spec, words", [("cpu", "wants BACKEND=N"), ("cpu=x", "is not a layer count"),
                                         ("cpu=-1", ">= 0"), ("torch=1", "is not one of the backends")])
def test_bad_n_layers_on(spec: str, words: str, tiny_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(tiny_model), "--backend", "cpu", "--n-layers-on", spec, "-n", "1"]) == 1
    assert words in one_line(capsys.readouterr().err)


def test_backend_plan() -> None:
    assert backend_plan(None, None) == (["cpu"], None)
    assert backend_plan(["torch", "cpu"], None) == (["torch", "cpu"], None)
    assert backend_plan(["torch", "cpu"], ["torch=3"]) == (["torch", "cpu"], [3])
    assert backend_plan(None, ["torch:cuda:0=5"]) == (["torch:cuda:0", "cpu"], [5])  # the rest on the CPU
    assert backend_plan(["a", "b", "c"], ["b=2"]) == (["a", "b", "c"], [0, 2])
    assert backend_plan(["a", "b", "c"], ["a=1", "b=2"]) == (["a", "b", "c"], [1, 2])
