"""What the command line says while numba compiles the CPU kernels (the first run on a machine).

A first run compiles each kernel the model's graph needs when it first needs
it, seconds each, and numba keeps the result on disk: later runs load it. So
the user hears, before the first compile, what is happening and that it
happens once (always: a silent minute looks like a hang). On a terminal, or
with --verbose, long compiles also show progress: a line every
PROGRESS_SECONDS while one runs, and with --verbose one line per compiled
kernel. Lines, never a redrawn line: the generated text may share the
terminal.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import TextIO

from pyggml.ggml_backend.registry import COMPILE_CACHE_FOLDER, WATCH_COMPILES, Reg, loaded_regs, reg_by_name

PROGRESS_SECONDS = 5.0
COMPILING_DEFAULT = "cpu"  # the registry listened to even before any backend is made


class CompileNotice:
    """Hears numba's compiles (through the registries that answer WATCH_COMPILES) and tells `err` about them."""

    def __init__(self, err: TextIO, prog: str, verbose: bool = False, tty: bool | None = None) -> None:
        self.err, self.prog, self.verbose = err, prog, verbose
        self.progress = verbose or (err.isatty() if tty is None else tty)
        self.lock = threading.Lock()
        self.n_started = 0
        self.n_done = 0
        self.current: str | None = None
        self.t_first = 0.0
        self.stop = threading.Event()
        self.ticker: threading.Thread | None = None

    def _say(self, text: str) -> None:
        try:
            print(f"{self.prog}: {text}", file=self.err, flush=True)
        except (OSError, ValueError):  # a closed or broken stderr must not stop the compile
            pass

    def start(self, name: str, source: str | None) -> None:
        with self.lock:
            self.n_started += 1
            self.current = name
            if self.n_started > 1:
                return
            self.t_first = time.monotonic()
        where = _cache_folder(source)
        kept = f"numba keeps them in {where}" if where else "numba keeps them"
        self._say(f"compiling the CPU kernels this model needs; this happens once ({kept}) and takes a while")
        if self.progress:
            self.ticker = threading.Thread(target=self._tick, name="pyggml-compile-progress", daemon=True)
            self.ticker.start()

    def end(self, name: str, seconds: float) -> None:
        with self.lock:
            self.n_done += 1
            self.current = None
        if self.verbose:
            self._say(f"compiled {name} in {seconds:.1f} s")

    def _tick(self) -> None:
        while not self.stop.wait(PROGRESS_SECONDS):
            with self.lock:
                current, done, elapsed = self.current, self.n_done, time.monotonic() - self.t_first
            if current is not None:
                self._say(f"compiling: {done} kernel(s) done in {elapsed:.0f} s, now {current}")

    def close(self) -> None:
        self.stop.set()
        if self.ticker is not None:
            self.ticker.join()


def _cache_folder(source: str | None) -> str | None:
    if source is None:
        return None
    for reg in _compiling_regs():
        folder = reg.get_proc_address(COMPILE_CACHE_FOLDER)
        try:
            found = folder(source) if folder is not None else None
        except OSError:
            found = None
        if found:
            return found
    return None


def _compiling_regs() -> list[Reg]:
    """The registries whose kernels compile at run time (they answer WATCH_COMPILES): the CPU's, every
    command's backend; the others' are asked only when already loaded (loading torch to listen costs seconds)."""
    regs = [reg_by_name(COMPILING_DEFAULT), *loaded_regs()]
    unique = {id(reg): reg for reg in regs if reg is not None}
    return [reg for reg in unique.values() if reg.get_proc_address(WATCH_COMPILES) is not None]


@contextmanager
def compile_notice(err: TextIO, prog: str, verbose: bool = False) -> Iterator[CompileNotice]:
    """A CompileNotice listening to numba's compiles within the block."""
    notice = CompileNotice(err, prog, verbose)
    try:
        with ExitStack() as watching:
            for reg in _compiling_regs():
                watching.enter_context(reg.get_proc_address(WATCH_COMPILES)(notice.start, notice.end))
            yield notice
    finally:
        notice.close()
