"""The assignment printout (GGML_SCHED_DEBUG), the per-backend figures after a compute, the Graphviz export."""

from __future__ import annotations

import logging

import pytest
from sched_graphs import small_run

from pyggml.sched import fmt_size
from pyggml.seed import Scheduler


@pytest.fixture
def computed(cpu_a, cpu_b, small_weight, rng):
    w, _ = small_weight
    sched = Scheduler([cpu_a, cpu_b])
    small_run(sched, w, cpu_b, None)
    return sched, w


def test_debug_printout_only_with_the_switch(computed, cpu_b, rng, caplog, monkeypatch) -> None:
    sched, w = computed
    caplog.set_level(logging.DEBUG, logger="pyggml.sched")
    monkeypatch.delenv("GGML_SCHED_DEBUG", raising=False)
    small_run(sched, w, cpu_b, rng)
    assert not any("## SPLIT" in r.getMessage() for r in caplog.records)

    monkeypatch.setenv("GGML_SCHED_DEBUG", "1")
    g, _, _ = small_run(sched, w, cpu_b, rng)
    text = "\n".join(r.getMessage() for r in caplog.records)
    # the seed's format: split headers with their inputs, one line per node that is not a view op
    assert "## SPLIT #0: CPU # 1 inputs: [x (   0K)] " in text
    assert "## SPLIT #1: CPU # 1 inputs: [rr (   0K)] " in text
    assert ("node #  0 (   MUL_MAT):                    y (  0K) [ CPU   1.src0]:"
            "                    w (  0K) [ CPU         ]                CPU#x (  0K) [ CPU         ]") in text
    assert "node #  3 (       MUL):                    m (  0K) [ CPU   1.src1]:" in text
    assert "node #  5 (       ADD):                  out (  0K) [ CPU   2.src1]:" in text
    assert "rr (" not in text.split("## SPLIT #1")[0].split("node #  1")[1]  # view ops have no line
    assert "sched: 6 nodes in 3 splits" in text  # the figures after the compute
    assert text.count("## SPLIT") == 3
    assert sched.format_assignments(g.graph).count("node #") == 4


def test_fmt_size() -> None:
    sizes = (0, 1023, 1024, 1024 * 1024 - 1, 1024 * 1024, 5 * 1024 * 1024 + 1)
    assert [fmt_size(n) for n in sizes] == ["0K", "0K", "1K", "1023K", "1M", "5M"]


def test_stats_after_compute(computed, cpu_b, rng) -> None:
    sched, w = computed
    g, _, _ = small_run(sched, w, cpu_b, rng)
    st = sched.stats
    assert (st.n_nodes, st.n_splits) == (6, 3)
    a, b = st.backends
    # A computes splits 0 and 2 and receives x (4 x 2 floats) and m (6 floats); B computes split 1 and receives rr
    assert (a.n_splits, a.n_copies, a.bytes_copied) == (2, 2, 32 + 24)
    assert (b.n_splits, b.n_copies, b.bytes_copied) == (1, 1, 24)
    assert st.bytes_copied == 80
    assert a.compute_time > 0 and b.compute_time > 0 and a.copy_time > 0 and st.split_time > 0 and st.alloc_time > 0
    assert st.sched_time == st.split_time + st.alloc_time
    text = st.format()
    assert "sched: 6 nodes in 3 splits" in text
    assert "#0 CPU: 2 splits" in text and "(2 inputs, 56 B)" in text and "#1 CPU: 1 splits" in text


def test_graphviz_export(computed, cpu_b, rng, tmp_path) -> None:
    sched, w = computed
    g, _, _ = small_run(sched, w, cpu_b, rng)
    path = tmp_path / "sched.dot"
    text = sched.dump_dot(g.graph, str(path))
    assert path.read_text() == text
    assert text.startswith("digraph G {") and text.rstrip().endswith("}")
    assert text.count("subgraph cluster_") == 4  # three splits and the legend
    assert 'label = "split 1: #1 CPU (nodes 3..5); inputs: rr";' in text
    lines = text.splitlines()

    def line_of(label_start: str) -> str:
        return next(line for line in lines if f'label = "{label_start} (' in line)

    assert 'fillcolor = "lightskyblue"' in line_of("y")  # backend #0
    assert 'fillcolor = "palegreen"' in line_of("m")  # backend #1
    assert 'fillcolor = "palegreen"' in line_of("CPU#rr") and "dashed" in line_of("CPU#rr")
    assert "1.src1" in line_of("m")
    assert sum('label = "copy"' in line for line in lines) == 3
    assert text.count("->") == sum(1 for n in g.graph.nodes for s in n.src if s is not None) + 3
