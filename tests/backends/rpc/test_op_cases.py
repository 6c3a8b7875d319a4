"""The op cases through RPC: `pyggml test-ops`' whole table on an rpc backend served by the real
ggml-rpc-server, against real ggml (issue 23's "the op cases through RPC").

ggml's CPU kernels abort on some nodes its supports_op accepts (F16 SCALE, ...), and an aborted server is
a lost connection: the reference probes each node in a forked child first, and the cases it aborts on are
"not supported" and never sent. Every other case must give ggml's own result.

The command runs in a process of its own, as a user runs it: the reference forks for each probe and
compute, and a fork of this test process (its heap grown by the whole suite) costs several times more."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from pyggml.testing import op_check

ROOT = Path(__file__).resolve().parents[3]


def test_the_op_cases_through_ggmls_rpc_server(c_endpoint: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this tree's pyggml, whatever is installed
    r = subprocess.run([sys.executable, "-m", "pyggml.cli", "test-ops", "-b", f"rpc://{c_endpoint}",
                        "--against", "ggml"], capture_output=True, text=True, timeout=3600, env=env)  # ~8000 cases
    text = r.stdout
    summary = re.search(r"(\d+)/(\d+) passed, (\d+) failed, (\d+) not supported", text)
    assert summary is not None, (text[-2000:], r.stderr[-2000:])
    passed, total, failed, unsupported = map(int, summary.groups())
    assert r.returncode == 0 and failed == 0, "\n".join(line for line in text.splitlines() if "FAIL" in line)
    assert total == len(op_check.all_cases()) and passed + unsupported == total
    # only what ggml's CPU refuses is left out: what its kernels abort on, and CONV_2D's channels-innermost cases
    # (test-backend-ops' own) whose kernel is not contiguous, which its supports_op refuses
    channels_innermost = sum(c.label == "CONV_2D" and "cwhn=1" in c.desc for c in op_check.all_cases())
    assert passed >= 0.95 * (total - channels_innermost)
