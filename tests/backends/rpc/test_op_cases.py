"""The op cases through RPC: `pyggml test-ops`' whole table on an rpc backend served by the real
ggml-rpc-server, against real ggml computing in this process (issue 23's "the op cases through RPC").

ggml's CPU kernels abort on some nodes its supports_op accepts (F16 SCALE, ...), and an aborted server is
a lost connection: the reference probes each node in a forked child first, and the cases it aborts on are
"not supported" and never sent. Every other case must give ggml's own result."""

from __future__ import annotations

import io
import re

from pyggml.testing import test_ops


def test_the_op_cases_through_ggmls_rpc_server(c_endpoint: str) -> None:
    out = io.StringIO()
    rc = test_ops.run(f"rpc://{c_endpoint}", out=out, against="ggml")
    text = out.getvalue()
    summary = re.search(r"(\d+)/(\d+) passed, (\d+) failed, (\d+) not supported", text)
    assert summary is not None, text[-2000:]
    passed, total, failed, unsupported = map(int, summary.groups())
    assert rc == 0 and failed == 0, "\n".join(line for line in text.splitlines() if "FAIL" in line)
    assert total == len(test_ops.all_cases()) and passed + unsupported == total
    assert passed >= 0.95 * total  # only what ggml's own kernels abort on is left out
