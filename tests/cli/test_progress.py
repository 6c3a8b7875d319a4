"""What the command line says while it works: before numba's first compile one line, always; progress of
compiles and of loading on a terminal or with --verbose only."""

from __future__ import annotations

import io
import time

import pytest
from numba import njit

from pyggml.cli import _compile_notice, run
from pyggml.cli._compile_notice import CompileNotice
from pyggml.cli.main import main


def _lines(err: io.StringIO) -> list[str]:
    return err.getvalue().splitlines()


def test_one_line_before_the_first_compile_and_nothing_more_off_a_terminal() -> None:
    err = io.StringIO()
    notice = CompileNotice(err, "pyggml run", verbose=False, tty=False)
    notice.start("mul_mat_F16_x86", __file__)
    notice.end("mul_mat_F16_x86", 3.0)
    notice.start("silu_rows", __file__)
    notice.end("silu_rows", 1.0)
    notice.close()
    lines = _lines(err)
    assert len(lines) == 1
    assert lines[0].startswith("pyggml run: compiling the CPU kernels") and "once" in lines[0]


def test_verbose_names_each_compiled_kernel() -> None:
    err = io.StringIO()
    notice = CompileNotice(err, "pyggml run", verbose=True, tty=False)
    notice.start("mul_mat_F16_x86", __file__)
    notice.end("mul_mat_F16_x86", 3.25)
    notice.close()
    assert _lines(err)[1:] == ["pyggml run: compiled mul_mat_F16_x86 in 3.2 s"]


def test_a_long_compile_on_a_terminal_shows_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_compile_notice, "PROGRESS_SECONDS", 0.01)
    err = io.StringIO()
    notice = CompileNotice(err, "pyggml run", verbose=False, tty=True)
    notice.start("mul_mat_Q4_1_x86", __file__)
    deadline = time.monotonic() + 10
    while len(_lines(err)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    notice.end("mul_mat_Q4_1_x86", 1.0)
    notice.close()
    progress = _lines(err)[1:]
    assert progress and all(line.startswith("pyggml run: compiling: 0 kernel(s) done") and
                            line.endswith("now mul_mat_Q4_1_x86") for line in progress)


def test_no_compile_no_word() -> None:
    err = io.StringIO()
    with _compile_notice.compile_notice(err, "pyggml run"):
        pass
    assert err.getvalue() == ""


def test_pyggml_run_tells_before_it_compiles(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A kernel first needed during the run (a function numba has not compiled) is announced on stderr,
    before the run's figures."""

    @njit
    def new_kernel(x: int) -> int:
        return x * 3

    warm_up = run._warm_up

    def warm_up_compiling(model: object) -> None:
        assert new_kernel(2) == 6
        warm_up(model)

    monkeypatch.setattr(run, "_warm_up", warm_up_compiling)
    assert main(["run", "-n", "2", "--temp", "0"]) == 0
    err = capsys.readouterr().err.splitlines()
    notices = [i for i, line in enumerate(err) if line.startswith("pyggml run: compiling the CPU kernels")]
    figures = [i for i, line in enumerate(err) if line.startswith("load time:")]
    assert len(notices) == 1 and figures and notices[0] < figures[0]


@pytest.mark.parametrize("verbose", [False, True])
def test_loading_shows_progress_off_a_terminal_only_with_verbose(verbose: bool,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-n", "1", "--temp", "0", *(["-v"] if verbose else [])]) == 0
    err = capsys.readouterr().err
    assert ("loading builtin-llama.gguf" in err) == verbose
