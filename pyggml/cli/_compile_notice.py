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
from contextlib import contextmanager
from typing import TextIO

PROGRESS_SECONDS = 5.0


class CompileNotice:
    """Hears numba's compiles (see pyggml.backends.cpu.jit.watch_compiles) and tells `err` about them."""

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
    from pyggml.backends.cpu.jit import cache_folder

    try:
        return cache_folder(source)
    except OSError:
        return None


@contextmanager
def compile_notice(err: TextIO, prog: str, verbose: bool = False) -> Iterator[CompileNotice]:
    """A CompileNotice listening to numba's compiles within the block."""
    from pyggml.backends.cpu.jit import watch_compiles

    notice = CompileNotice(err, prog, verbose)
    try:
        with watch_compiles(notice.start, notice.end):
            yield notice
    finally:
        notice.close()
