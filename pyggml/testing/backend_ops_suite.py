"""llama.cpp's test-backend-ops, op by op, on an RPC device served by `pyggml rpc-server` or ggml-rpc-server.

test-backend-ops (0c1e570, built by `pyggml.testing.llamacpp` in its tests folder with the patch that makes the
RPC servers of $PYGGML_RPC_SERVERS devices) runs every case of an op on device RPC0 and compares it with
llama.cpp's own CPU backend, each case against its own error bound, as for any ggml backend. This module runs
it once per op of `--list-ops`, each op in a process of its own with a time limit, and records every case's
verdict and the time the op took. An RPC device claims every op (ggml's RPC client has no supports_op call),
so a case the server refuses (`pyggml rpc-server --no-fallback` with a backend that lacks a node's op: its log
says which) ends its op's run: that case is recorded as unclaimed and the op runs again from the case after it
($PYGGML_SKIP_CASES of the patch, whose line before each case names it). A run ended any other way (a crash,
an abort without the server's refusal, the time limit) ends the op; a server such a run ended is started again
for the next op. A case test-backend-ops lists twice with the same parameters has a verdict each time ("NAME #2").

Command line::

    python -m pyggml.testing.backend_ops_suite [--server pyggml|ggml ...] [-o OP,...] [--timeout S] [-j N]
        [-b BACKEND] [--no-fallback] [--max-refusals N] [-p REGEX]

(`-b` and `--no-fallback` are `pyggml rpc-server`'s: the backend it serves, and refusing a graph with a node that
backend lacks instead of computing that node on the host CPU; `--max-refusals` and `-p` leave cases out, as
"not run": an op's cases after N refused in a row, the cases whose parameters REGEX does not find)

prints, for each server, the table op | cases | claimed | passed | failed | unclaimed | not run | time (claimed: the
cases run that the server did not refuse), the whole run's time, then each failed and each unclaimed case (with
the op the server refused); exit status 1 when a case fails or a run does not finish on any server.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from pyggml.testing import llamacpp

__all__ = ["SERVERS", "OpRun", "RPCServer", "format_table", "list_ops", "main", "numbered", "parse_cases", "run_op",
           "run_suite", "list_cases"]

SERVERS = ("pyggml", "ggml")  # `pyggml rpc-server`, llama.cpp's ggml-rpc-server
DEFAULT_TIMEOUT = 900.0  # seconds an op's run may take
_LISTEN_TIMEOUT = 60.0  # seconds a server may take to listen (pyggml's imports and backends)
_SETTLE_TIMEOUT = 5.0  # seconds a server brought down by a run may take to exit
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# a case's line: "  OP(params): ... OK" (or FAIL, "not supported [...]", "skipping large tensors for speed")
_CASE = re.compile(r"^  ([A-Z][A-Z0-9_]*\(.*?\)): (.*)$")
_ERROR = re.compile(r"error|failed|abort|GGML_ASSERT", re.IGNORECASE)

# the server's log line when it refuses a graph with a node its backend lacks (--no-fallback)
_REFUSAL = re.compile(r"GRAPH_COMPUTE on '[^']*': .*does not support op (\S+) of node \d+ '")
_ANNOUNCED = re.compile(rf"^{re.escape(llamacpp.CASE_ANNOUNCE)}(\d+): (.*)$")

OK, FAIL, NOT_SUPPORTED, SKIPPED = "OK", "FAIL", "not supported", "skipped"
UNCLAIMED, NOT_RUN = "unclaimed", "not run"  # the server refused the case; a run cut short left it out


@dataclass
class OpRun:
    """One op's run of test-backend-ops on one server."""

    op: str
    server: str
    verdicts: dict[str, str]  # case -> OK, FAIL, "not supported", "skipped", "unclaimed", "not run", in order
    seconds: float
    finished: bool  # its last process printed its summary and exited (not killed by the time limit, not aborted)
    detail: str = ""  # why it did not finish: the end of its output and the server's
    refusals: dict[str, str] = field(default_factory=dict)  # unclaimed case -> the op the server refused

    @property
    def cases(self) -> int:
        return len(self.verdicts)

    def count(self, verdict: str) -> int:
        return sum(v == verdict for v in self.verdicts.values())

    @property
    def passed(self) -> int:
        return self.count(OK)

    @property
    def claimed(self) -> int:
        """The cases run that the server did not refuse."""
        return self.cases - self.count(UNCLAIMED) - self.count(NOT_RUN)

    @property
    def failed(self) -> list[str]:
        return [case for case, v in self.verdicts.items() if v == FAIL]

    @property
    def ok(self) -> bool:
        return self.finished and not self.failed


def numbered(cases: Sequence[str]) -> list[str]:
    """The case names with each repeat marked by its occurrence ("NAME #2", ...): test-backend-ops lists a few cases
    twice with the same parameters, and each has a verdict of its own."""
    seen: dict[str, int] = {}
    out = []
    for case in cases:
        seen[case] = seen.get(case, 0) + 1
        out.append(case if seen[case] == 1 else f"{case} #{seen[case]}")
    return out


def _case_lines(output: str) -> list[tuple[str, str]]:
    """(case, verdict) of every case line of a test-backend-ops `test` run's output (console format), in order."""
    found = []
    for raw in output.splitlines():
        m = _CASE.match(_ANSI.sub("", raw).rstrip())
        if m is None:
            continue
        case, rest = m.groups()
        if rest.endswith(OK):
            found.append((case, OK))
        elif rest.endswith(FAIL):
            found.append((case, FAIL))
        elif rest.startswith(NOT_SUPPORTED):
            found.append((case, NOT_SUPPORTED))
        elif rest.startswith("skipping"):
            found.append((case, SKIPPED))
    return found


def parse_cases(output: str) -> dict[str, str]:
    """The verdict of every case a test-backend-ops `test` run printed (console format), repeats `numbered`."""
    found = _case_lines(output)
    return dict(zip(numbered([case for case, _ in found]), [v for _, v in found], strict=True))


def list_ops(binary: Path) -> list[str]:
    """The ops of `test-backend-ops --list-ops` (ggml's ops, unary ops and GLU ops by name)."""
    r = subprocess.run([str(binary), "--list-ops"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"{binary} --list-ops failed (exit {r.returncode}): {r.stderr[-2000:]}")
    ops = [line.strip() for line in r.stdout.splitlines() if line.startswith("  ") and line.strip()]
    if not ops:
        raise RuntimeError(f"{binary} --list-ops listed no ops:\n{r.stdout[-2000:]}")
    return ops


def list_cases(binary: Path, op: str, params: str | None = None) -> list[str]:
    """The cases of `op` (whose parameters the regex `params` finds) in the order test-backend-ops runs them (its
    patch's list mode, on its own CPU)."""
    env = {**os.environ, llamacpp.SKIP_CASES_ENV: "0", llamacpp.LIST_CASES_ENV: "1"}
    r = subprocess.run([str(binary), "test", "-b", "CPU", *_case_filter(op, params)], capture_output=True, text=True,
                       timeout=120, env=env, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise RuntimeError(f"listing the cases of {op} failed (exit {r.returncode}): {r.stdout[-2000:]}")
    return [m.group(2) for line in r.stdout.splitlines() if (m := _ANNOUNCED.match(line))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RPCServer:
    """An RPC server process on a free 127.0.0.1 port, its output in a log file; `ensure()` (re)starts it."""

    def __init__(self, kind: str, threads: int | None = None, ggml_rpc_server: Path | None = None,
                 pyggml_args: Sequence[str] = ()) -> None:
        if kind not in SERVERS:
            raise ValueError(f"unknown RPC server {kind!r}: one of {', '.join(SERVERS)}")
        if kind == "ggml" and ggml_rpc_server is None:
            raise ValueError("the ggml server needs the path of ggml-rpc-server")
        self.kind, self.threads, self.binary = kind, threads, ggml_rpc_server
        self.pyggml_args = list(pyggml_args)  # more options of `pyggml rpc-server` ("-b", "torch", "--no-fallback")
        self.proc: subprocess.Popen[bytes] | None = None
        self.endpoint = ""
        self.starts = 0
        # appended to by the server (O_APPEND: its writes never land where this process reads), read by path
        fd, log_path = tempfile.mkstemp(prefix="rpc-server-", suffix=".log")
        os.close(fd)
        self._log_path = Path(log_path)
        self._log: IO[bytes] = open(log_path, "ab")  # closed by close()

    def _command(self, port: int) -> list[str]:
        threads = ["-t", str(self.threads)] if self.threads else []
        if self.kind == "pyggml":
            # no idle limit: test-backend-ops computes its CPU reference between messages
            return [sys.executable, "-m", "pyggml.cli", "rpc-server", "-H", "127.0.0.1", "-p", str(port),
                    "--timeout", "0", *threads, *self.pyggml_args]
        return [str(self.binary), "-H", "127.0.0.1", "-p", str(port), *threads]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def settle(self, seconds: float = _SETTLE_TIMEOUT) -> bool:
        """Whether the server still runs after a run ended early, given `seconds` to exit if it is going to (a
        server the run brought down is then restarted by the next `ensure`, never sent the next op)."""
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=seconds)
        return self.alive()

    def ensure(self) -> str:
        """The endpoint of a running server, starting one if there is none or it exited."""
        if self.alive():
            return self.endpoint
        self.stop()
        port = _free_port()
        self._log.write(f"\n--- start {self.starts + 1}: port {port}\n".encode())
        self._log.flush()
        self.proc = subprocess.Popen(self._command(port), stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        self.starts += 1
        deadline = time.monotonic() + _LISTEN_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the {self.kind} RPC server exited with {self.proc.returncode} before "
                                   f"listening:\n{self.log_tail()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1.0):
                self.endpoint = f"127.0.0.1:{port}"
                return self.endpoint
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the {self.kind} RPC server did not listen on port {port} within {_LISTEN_TIMEOUT} s")

    def log_size(self) -> int:
        """Where the log ends now (for `log_since`)."""
        self._log.flush()
        return self._log_path.stat().st_size

    def log_since(self, offset: int) -> str:
        """The server's output from `offset` (a `log_size`) on."""
        self._log.flush()
        with open(self._log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def log_tail(self, n: int = 4000) -> str:
        return self.log_since(max(0, self.log_size() - n))

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=30)
            self.proc = None

    def close(self) -> None:
        self.stop()
        self._log.close()
        self._log_path.unlink(missing_ok=True)

    def __enter__(self) -> RPCServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class _Attempt:
    """One test-backend-ops process of an op's run: from case `skip` on."""

    verdicts: list[tuple[str, str]]  # (case, verdict) in the order run
    finished: bool
    detail: str
    refused: tuple[int, str, str] | None  # (the case's index, its name, the op refused) when the server refused it


def _case_filter(op: str, params: str | None) -> list[str]:
    """test-backend-ops' arguments selecting the cases of `op` whose parameters `params` (a regex) finds."""
    return ["-o", op, *(["-p", params] if params is not None else [])]


def _attempt(binary: Path, server: RPCServer, op: str, params: str | None, skip: int, timeout: float) -> _Attempt:
    endpoint = server.ensure()
    log_start = server.log_size()
    env = {**os.environ, llamacpp.RPC_SERVERS_ENV: endpoint, llamacpp.SKIP_CASES_ENV: str(skip)}
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([str(binary), "test", "-b", "RPC0", *_case_filter(op, params)], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        try:
            rc: int | None = proc.wait(timeout=max(timeout, 0.0))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = None
        out.seek(0)
        text = _ANSI.sub("", out.read().decode(errors="replace"))
    verdicts = _case_lines(text)
    summary = re.search(r"^\s*(\d+)/(\d+) tests passed", text, re.MULTILINE)
    if rc is not None and summary is not None:
        return _Attempt(verdicts, True, "", None)
    announced = [m.groups() for line in text.splitlines() if (m := _ANNOUNCED.match(line))]
    refusal = _REFUSAL.search(server.log_since(log_start))
    if rc is not None and announced and refusal is not None:
        index, case = announced[-1]
        return _Attempt(verdicts, False, "", (int(index), case, refusal.group(1)))
    why = f"killed after {timeout:g} s" if rc is None else f"exit status {rc}"
    # what test-backend-ops said of the error (before gdb's backtrace of an abort), or its last lines
    lines = [line for line in text.splitlines()
             if line.strip() and not _case_lines(line) and not _ANNOUNCED.match(line)]
    ours = [line for line in lines if _ERROR.search(line)] or lines
    theirs = [line for line in server.log_tail(3000).splitlines() if line.strip()]
    state = "running" if server.settle() else "exited"
    detail = f"{why}; test-backend-ops: {' | '.join(ours[-2:])}; the server ({state}): {' | '.join(theirs[-1:])}"
    return _Attempt(verdicts, False, detail, None)


def run_op(binary: Path, server: RPCServer, op: str, timeout: float = DEFAULT_TIMEOUT,
           max_refusals: int | None = None, params: str | None = None) -> OpRun:
    """Every case of `op` through `server` (started if it is not running): test-backend-ops test -b RPC0 -o OP,
    again from the case after each one the server refuses (recorded as unclaimed), within `timeout` in all.

    Each refusal costs a test-backend-ops process, and an op the backend lacks is refused case by case, so cases
    can be left out (recorded as "not run"): after `max_refusals` refusals in a row the op's later cases, and
    with `params` (test-backend-ops' -p: a regex its parameters must match) the cases it does not find."""
    if max_refusals is not None and max_refusals < 1:
        raise ValueError(f"max_refusals must be >= 1, got {max_refusals}")
    t0 = time.monotonic()
    ran: list[tuple[str, str]] = []  # (case, verdict) in the order run, repeats not yet numbered
    refused: dict[int, str] = {}  # the place in `ran` of each case the server refused -> the op it refused

    def result(finished: bool, detail: str, left_out: Sequence[str]) -> OpRun:
        """The run so far, with the cases of `left_out` (numbered as listed) it did not reach recorded as not run."""
        cases = numbered([case for case, _ in ran])
        verdicts = dict(zip(cases, [v for _, v in ran], strict=True))
        for case in left_out:
            verdicts.setdefault(case, NOT_RUN)
        return OpRun(op, server.kind, verdicts, time.monotonic() - t0, finished, detail,
                     {cases[i]: refused_op for i, refused_op in refused.items()})

    skip = streak = 0
    while True:
        attempt = _attempt(binary, server, op, params, skip, timeout - (time.monotonic() - t0))
        ran.extend(attempt.verdicts)
        if attempt.refused is None:
            left_out = numbered(list_cases(binary, op)) if params is not None and attempt.finished else []
            return result(attempt.finished, attempt.detail, left_out)
        index, case, refused_op = attempt.refused
        refused[len(ran)] = refused_op
        ran.append((case, UNCLAIMED))
        skip = index + 1
        streak = 1 if attempt.verdicts else streak + 1
        if max_refusals is not None and streak >= max_refusals:
            return result(True, "", [*numbered(list_cases(binary, op, params))[skip:],
                                     *(numbered(list_cases(binary, op)) if params else [])])


@dataclass
class SuiteResult:
    """The runs of every op on every server, and the whole run's time."""

    runs: dict[str, list[OpRun]] = field(default_factory=dict)  # server -> its runs, in the order of the ops
    seconds: float = 0.0


def run_suite(binary: Path, servers: Sequence[str], ops: Sequence[str] | None = None, *,
              timeout: float = DEFAULT_TIMEOUT, jobs: int = 1, threads: int | None = None,
              ggml_rpc_server: Path | None = None, progress: IO[str] | None = None,
              pyggml_args: Sequence[str] = (), max_refusals: int | None = None,
              params: str | None = None) -> SuiteResult:
    """Run every op (default: all of --list-ops) on each server in turn; `jobs` ops at once, each job with a
    server of its own; `pyggml_args` are more options of `pyggml rpc-server`; `max_refusals` and `params` as
    `run_op`'s."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    ops = list(ops) if ops is not None else list_ops(binary)
    result = SuiteResult()
    t_all = time.monotonic()
    lock = threading.Lock()
    for kind in servers:
        pool = [RPCServer(kind, threads, ggml_rpc_server, pyggml_args) for _ in range(jobs)]
        free = list(pool)
        done: dict[str, OpRun] = {}

        def one(op: str, kind: str = kind, free: list[RPCServer] = free, done: dict[str, OpRun] = done) -> None:
            with lock:
                server = free.pop()
            try:
                run = run_op(binary, server, op, timeout, max_refusals, params)
            finally:
                with lock:
                    free.append(server)
            with lock:
                done[op] = run
                if progress is not None:
                    state = "" if run.finished else f"  (did not finish: {run.detail[:300]})"
                    progress.write(f"[{kind} {len(done)}/{len(ops)}] {op}: {run.passed}/{run.cases} passed, "
                                   f"{len(run.failed)} failed, {run.count(UNCLAIMED)} unclaimed, "
                                   f"{run.count(NOT_RUN)} not run, "
                                   f"{run.seconds:.1f} s{state}\n")
                    progress.flush()

        try:
            with ThreadPoolExecutor(max_workers=jobs) as ex:
                for f in [ex.submit(one, op) for op in ops]:
                    f.result()
        finally:
            for s in pool:
                s.close()
        result.runs[kind] = [done[op] for op in ops]
    result.seconds = time.monotonic() - t_all
    return result


def format_table(result: SuiteResult) -> str:
    """op | cases | claimed | passed | failed | unclaimed | not run | time, one column group per server (claimed:
    the cases run that the server did not refuse; a run that did not finish is marked "!"), then each server's
    totals and the whole run's time."""
    servers = list(result.runs)
    by_op: dict[str, dict[str, OpRun]] = {}
    for kind, runs in result.runs.items():
        for run in runs:
            by_op.setdefault(run.op, {})[kind] = run
    head = "| op | " + " | ".join(f"{k}: cases | claimed | passed | failed | unclaimed | not run | time (s)"
                                   for k in servers) + " |"
    rule = "|---|" + "|".join("---:|---:|---:|---:|---:|---:|---:" for _ in servers) + "|"
    lines = [head, rule]
    for op, runs in by_op.items():
        cells = []
        for k in servers:
            r = runs.get(k)
            if r is None:
                cells.append(" | | | | | | ")
                continue
            mark = "" if r.finished else " !"
            cells.append(f"{r.cases}{mark} | {r.claimed} | {r.passed} | {len(r.failed)} | {r.count(UNCLAIMED)} | "
                         f"{r.count(NOT_RUN)} | {r.seconds:.1f}")
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    for k in servers:
        runs = result.runs[k]
        lines.append(f"{k}: {len(runs)} ops, {sum(r.ok for r in runs)} pass every case; "
                     f"{sum(r.cases for r in runs)} cases, {sum(r.claimed for r in runs)} claimed, "
                     f"{sum(r.passed for r in runs)} passed, "
                     f"{sum(r.count(UNCLAIMED) for r in runs)} unclaimed, {sum(r.count(NOT_RUN) for r in runs)} not "
                     f"run, "
                     f"{sum(len(r.failed) for r in runs)} failed; {sum(not r.finished for r in runs)} runs did "
                     f"not finish; {sum(r.seconds for r in runs):.0f} s of runs")
    lines.append(f"whole run: {result.seconds:.0f} s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyggml.testing.backend_ops_suite",
                                     description="Run llama.cpp's test-backend-ops op by op on an RPC device "
                                                 "served by pyggml rpc-server and/or ggml-rpc-server.")
    parser.add_argument("--server", action="append", choices=SERVERS, default=None,
                        help="the servers to test, in order (default: pyggml, then ggml)")
    parser.add_argument("-o", "--ops", default=None, help="comma-separated ops (default: all of --list-ops)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds an op may take "
                        "(default: %(default)s)")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="ops run at once, each with its own server")
    parser.add_argument("-t", "--threads", type=int, default=None, help="the servers' threads (default: theirs)")
    parser.add_argument("-v", "--verbose", action="store_true", help="a line per op on stderr as it ends")
    parser.add_argument("-b", "--backend", default=None, metavar="NAME",
                        help="the backend pyggml rpc-server serves (torch, torch:cpu,matmul_precision=f32; "
                             "default: its own, cpu)")
    parser.add_argument("--no-fallback", action="store_true",
                        help="pyggml rpc-server refuses a node its backend lacks (a case of an op it does not "
                             "claim ends that op's run) instead of computing it on the host CPU")
    parser.add_argument("--max-refusals", type=int, default=None, metavar="N",
                        help="after N cases of an op refused in a row, leave its later cases out (\"not run\"; "
                             "default: run every case)")
    parser.add_argument("-p", "--params", default=None, metavar="REGEX",
                        help="only the cases whose parameters this regex finds (test-backend-ops' -p; the others "
                             "are \"not run\")")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if args.max_refusals is not None and args.max_refusals < 1:
        parser.error(f"--max-refusals must be >= 1, got {args.max_refusals}")
    servers = args.server or list(SERVERS)
    tools = llamacpp.require_tools(["test-backend-ops", "ggml-rpc-server"])
    ops = [o for o in args.ops.split(",") if o] if args.ops else None
    result = run_suite(tools["test-backend-ops"], servers, ops, timeout=args.timeout, jobs=args.jobs,
                       threads=args.threads, ggml_rpc_server=tools["ggml-rpc-server"],
                       progress=sys.stderr if args.verbose else None,
                       pyggml_args=(["-b", args.backend] if args.backend else []) + (["--no-fallback"] if
                                                                                      args.no_fallback else []),
                       max_refusals=args.max_refusals, params=args.params)
    print(format_table(result))
    for kind, runs in result.runs.items():
        for run in runs:
            for case in run.failed:
                print(f"{kind} FAIL {case}")
            for case, refused in run.refusals.items():
                print(f"{kind} unclaimed {case}: the server refused op {refused}")
            if not run.finished:
                print(f"{kind} {run.op} did not finish: {run.detail}")
    return 0 if all(r.ok for runs in result.runs.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
