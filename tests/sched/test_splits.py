"""Assignments, splits, inputs and copies worked out by hand from the seed's four passes."""

from __future__ import annotations

import numpy as np
from sched_graphs import (
    compute_on_one_backend,
    input_values,
    make_weights,
    run_block,
    small_run,
    split_table,
)

from pyggml.ggml_backend import tensor_get_numpy
from pyggml.seed import Scheduler

# --- a small graph ---
#
#   leafs: w [4, 3] in A's buffer; x [4, 2] and x2 [6, 1] in B's compute buffer
#   0 y   = mul_mat(w, x)     pass 1: w has memory on A (src0)                 -> A "1.src0"
#   1 r   = relu(y)           pass 2: y is on A                                -> A "2.src0"
#   2 rr  = reshape(r, 6, 1)  view op, pass 2 from r                           -> A "2.src0"
#   3 m   = mul(rr, x2)       pass 1: x2 has memory on B (src1)                -> B "1.src1"
#   4 yr  = reshape(y, 6, 1)  view op, pass 2 from y                           -> A "2.src0"
#   5 out = add(m, yr)        pass 2: m (B, 24 bytes) then yr (A, prio 0 < 1, 24 >= 24) -> A "2.src1"
#
# pass 4 (view ops skipped): A from node 0; node 3 switches to B, node 5 back to A:
#   split 0: A, nodes 0..3, inputs [x]  (y reads x from B)   -> copy "CPU#x" on A
#   split 1: B, nodes 3..5, inputs [rr] (m reads rr from A)  -> copy "CPU#rr" on B
#   split 2: A, nodes 5..6, inputs [m]  (out reads m from B) -> copy "CPU#m" on A


def test_small_graph_splits_inputs_and_copies(cpu_a, cpu_b, small_weight, rng) -> None:
    w, W = small_weight
    sched = Scheduler([cpu_a, cpu_b])
    small_run(sched, w, cpu_b, None)
    g, X, X2 = small_run(sched, w, cpu_b, rng)

    assert sched.n_splits == 3
    assert split_table(sched) == [(cpu_a, 0, 3, ["x"]), (cpu_b, 3, 5, ["rr"]), (cpu_a, 5, 6, ["m"])]
    causes = {t.name: sched.tensor_cause(t) for t in (g.y, g.r, g.rr, g.m, g.yr, g.out)}
    assert causes == {"y": "1.src0", "r": "2.src0", "rr": "2.src0", "m": "1.src1", "yr": "2.src0", "out": "2.src1"}
    for t, backend in ((g.y, cpu_a), (g.r, cpu_a), (g.m, cpu_b), (g.out, cpu_a), (g.x, cpu_b), (w, cpu_a)):
        assert sched.get_node_backend(t) is backend, t.name

    # consumers read the copies: one per (tensor, backend), named "<backend>#<name>", with the source's layout
    copy_x, copy_rr, copy_m = g.y.src[1], g.m.src[0], g.out.src[0]
    assert [copy_x.name, copy_rr.name, copy_m.name] == ["CPU#x", "CPU#rr", "CPU#m"]
    assert copy_x.buffer.backend is cpu_a and copy_rr.buffer.backend is cpu_b and copy_m.buffer.backend is cpu_a
    assert copy_rr.ne == g.rr.ne and copy_rr.nb == g.rr.nb and copy_rr.type == g.rr.type
    assert g.m.src[1] is g.x2 and g.out.src[1] is g.yr  # same-backend sources are left alone
    # the allocation graph: each split's copies first, then its nodes
    assert [t.name for t in sched.graph.nodes] == ["CPU#x", "y", "r", "rr", "CPU#rr", "m", "yr", "CPU#m", "out"]
    assert [n.name for n in sched.splits[1].graph.nodes] == ["m", "yr"]

    Y = X @ W.T
    expected = (np.maximum(Y, 0).reshape(1, 6) * X2 + Y.reshape(1, 6)).ravel()
    np.testing.assert_allclose(tensor_get_numpy(g.out), expected, rtol=1e-6, atol=1e-6)
    assert cpu_a.n_graph_compute == 2 and cpu_b.n_graph_compute == 1


def test_priority_order_decides_ties(cpu_a, cpu_b, small_weight, rng) -> None:
    """With B first, node 5 (out) takes m's backend: m is B (prio 0 now), yr on A (prio 1) is not better."""
    w, W = small_weight
    sched = Scheduler([cpu_b, cpu_a])
    small_run(sched, w, cpu_b, None)
    g, X, X2 = small_run(sched, w, cpu_b, rng)
    assert split_table(sched) == [(cpu_a, 0, 3, ["x"]), (cpu_b, 3, 6, ["rr", "yr"])]
    assert sched.tensor_cause(g.out) == "2.src0"
    assert g.out.src[1].name == "CPU#yr"
    Y = X @ W.T
    expected = (np.maximum(Y, 0).reshape(1, 6) * X2 + Y.reshape(1, 6)).ravel()
    np.testing.assert_allclose(tensor_get_numpy(g.out), expected, rtol=1e-6, atol=1e-6)


# --- a LLaMA block over two CPU backends: weights on A (priority 0), inputs x, pos, mask on B ---
#
# Node order (see sched_llama_block.build_block) and assignments by hand:
#   pass 1: norm (x on B: 1.src0 B), attn_norm-0 (attn_norm weight: 1.src1 A), Vcur/Kcur/Qcur/attn_out/ffn_gate/
#           ffn_up/ffn_out (their weight: 1.src0 A), Krope/Qrope (pos: 1.src1 B), kq_soft_max (mask: 1.src1 B),
#           ffn_inp (x: 1.src1 B), ffn_norm-0 (ffn_norm weight: 1.src1 A)
#   pass 2: Vr, Vp, Vt, Kr, Qr from A; K, Q, kq (K, Q on B) and norm_ffn (ffn_inp) on B; kqv (Vt on A beats
#           kq_soft_max on B), kqv_p, kqv_merged, ffn_silu, ffn_par, l_out (ffn_out on A first) on A
#   pass 4: the backend changes at nodes 1, 8, 10, 12, 16, 20, 22:
LLAMA_SPLITS_TWO_CPU = [
    ("B", 0, 1, []),
    ("A", 1, 8, ["norm"]),
    ("B", 8, 10, ["Kr"]),
    ("A", 10, 12, []),
    ("B", 12, 16, ["Qr"]),
    ("A", 16, 20, ["kq_soft_max"]),
    ("B", 20, 22, ["attn_out"]),
    ("A", 22, 29, ["norm_ffn", "ffn_inp"]),
]
LLAMA_BACKENDS_TWO_CPU = {
    "norm": "B", "attn_norm-0": "A", "Vcur": "A", "Vr": "A", "Vp": "A", "Vt": "A", "Kcur": "A", "Kr": "A",
    "Krope": "B", "K": "B", "Qcur": "A", "Qr": "A", "Qrope": "B", "Q": "B", "kq": "B", "kq_soft_max": "B",
    "kqv": "A", "kqv_p": "A", "kqv_merged": "A", "attn_out": "A", "ffn_inp": "B", "norm_ffn": "B",
    "ffn_norm-0": "A", "ffn_gate": "A", "ffn_silu": "A", "ffn_up": "A", "ffn_par": "A", "ffn_out": "A",
    "l_out": "A",
}


def test_llama_block_over_two_cpu_backends(cpu_a, cpu_b) -> None:
    weights = make_weights(lambda name: cpu_a)
    sched = Scheduler([cpu_a, cpu_b])
    run_block(sched, weights, 3, cpu_b, None)
    values = input_values(3)
    block = run_block(sched, weights, 3, cpu_b, values)

    names = {"A": cpu_a, "B": cpu_b}
    assert sched.n_splits == 8
    assert split_table(sched) == [(names[b], i0, i1, inputs) for b, i0, i1, inputs in LLAMA_SPLITS_TWO_CPU]
    got = {n.name: sched.get_node_backend(n) for n in block.graph.nodes}
    assert got == {name: names[b] for name, b in LLAMA_BACKENDS_TWO_CPU.items()}
    # one copy per (tensor, backend), in the split's backend, read by the consumers
    nodes = {n.name: n for n in block.graph.nodes}
    for node, j, copy_name, backend in (("attn_norm-0", 0, "CPU#norm", cpu_a), ("Krope", 0, "CPU#Kr", cpu_b),
                                        ("Qrope", 0, "CPU#Qr", cpu_b), ("kqv", 1, "CPU#kq_soft_max", cpu_a),
                                        ("ffn_inp", 0, "CPU#attn_out", cpu_b), ("ffn_norm-0", 0, "CPU#norm_ffn", cpu_a),
                                        ("l_out", 1, "CPU#ffn_inp", cpu_a)):
        cpy = nodes[node].src[j]
        assert cpy.name == copy_name and cpy.buffer.backend is backend, (node, cpy.name)
    assert [t.name for t in sched.graph.nodes if "#" in t.name] == [
        "CPU#norm", "CPU#Kr", "CPU#Qr", "CPU#kq_soft_max", "CPU#attn_out", "CPU#norm_ffn", "CPU#ffn_inp"]

    expected = compute_on_one_backend(cpu_a, 3, values)
    np.testing.assert_allclose(tensor_get_numpy(block.out), expected, rtol=1e-5, atol=1e-6)
    sched.free()
    weights.free()


# --- the MUL_MAT-only backend first, everything else on the CPU ---
#
# Matrix weights on T (testing BLAS, priority 0), norm weights and inputs on the CPU (C):
#   the seven weight products (Vcur, Kcur, Qcur, attn_out, ffn_gate, ffn_up, ffn_out) go to T (1.src0, T supports
#   contiguous F32 MUL_MAT); Vt (CONT of Vp on T) and ffn_silu (of ffn_gate on T) cannot run on T and no source
#   backend that can exists -> the first backend that supports them, C (2.prio); ffn_par and l_out skip their
#   T source (T cannot MUL/ADD) and take the CPU one; kq and kqv read only CPU tensors.
LLAMA_SPLITS_BLAS = [
    ("C", 0, 2, []),
    ("T", 2, 5, ["attn_norm-0"]),
    ("C", 5, 6, ["Vp"]),
    ("T", 6, 8, ["attn_norm-0"]),
    ("C", 8, 10, ["Kr"]),
    ("T", 10, 12, ["attn_norm-0"]),
    ("C", 12, 19, ["Qr"]),
    ("T", 19, 20, ["kqv_merged"]),
    ("C", 20, 23, ["attn_out"]),
    ("T", 23, 24, ["ffn_norm-0"]),
    ("C", 24, 25, ["ffn_gate"]),
    ("T", 25, 26, ["ffn_norm-0"]),
    ("C", 26, 27, ["ffn_up"]),
    ("T", 27, 28, ["ffn_par"]),
    ("C", 28, 29, ["ffn_out"]),
]
MATMULS_WITH_WEIGHTS = ["Vcur", "Kcur", "Qcur", "attn_out", "ffn_gate", "ffn_up", "ffn_out"]


def test_op_support_drives_assignment(blas, cpu_a) -> None:
    weights = make_weights(lambda name: cpu_a if "norm" in name else blas)
    sched = Scheduler([blas, cpu_a])
    run_block(sched, weights, 3, cpu_a, None)
    values = input_values(3)
    block = run_block(sched, weights, 3, cpu_a, values)

    names = {"T": blas, "C": cpu_a}
    assert split_table(sched) == [(names[b], i0, i1, inputs) for b, i0, i1, inputs in LLAMA_SPLITS_BLAS]
    nodes = {n.name: n for n in block.graph.nodes}
    assert sched.tensor_cause(nodes["Vt"]) == "2.prio" and sched.tensor_cause(nodes["ffn_silu"]) == "2.prio"
    assert sched.tensor_cause(nodes["ffn_par"]) == "2.src0" and sched.tensor_cause(nodes["l_out"]) == "2.src1"
    on_blas = [n.name for n in block.graph.nodes if sched.get_node_backend(n) is blas and n.op.name == "MUL_MAT"]
    assert on_blas == MATMULS_WITH_WEIGHTS
    assert blas.computed == MATMULS_WITH_WEIGHTS  # T ran exactly these nodes, nothing else
    # a copy made once per (tensor, backend) serves every split that lists the tensor
    assert nodes["Vcur"].src[1] is nodes["Kcur"].src[1] is nodes["Qcur"].src[1]
    assert nodes["Vcur"].src[1].name == "TestBLAS#attn_norm-0"
    assert nodes["ffn_gate"].src[1] is nodes["ffn_up"].src[1]

    expected = compute_on_one_backend(cpu_a, 3, values)
    np.testing.assert_allclose(tensor_get_numpy(block.out), expected, rtol=1e-5, atol=1e-5)
    stats = sched.stats.backends
    assert stats[0].n_splits == 7 and stats[1].n_splits == 8
    sched.free()
    weights.free()
