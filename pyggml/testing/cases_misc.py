"""Op checker cases of the small ops (pyggml.core.ops.misc), after test-backend-ops' own: broadcast-free
shapes with sizes 1 and odd, permuted sources where ggml's kernels take them, op_params across their range."""

from __future__ import annotations

import numpy as np

from pyggml.core.context import Context
from pyggml.core.tensor import Tensor, TriType
from pyggml.core.types import GGMLType
from pyggml.testing.op_check import BF16, F16, F32, I32, Init, OpCase, _ne, _t, indices, new, op, permuted, uniform


def lower_tri_system(rng: np.random.Generator, t: Tensor) -> np.ndarray:
    """Square matrices with a dominant diagonal (|d| in [2, 3)): a well-conditioned triangular solve."""
    n = t.ne[0]
    m = rng.uniform(-1.0, 1.0, (t.nelements() // (n * n), n, n)).astype(np.float32)
    idx = np.arange(n)
    m[:, idx, idx] = rng.uniform(2.0, 3.0, (m.shape[0], n)) * rng.choice([-1.0, 1.0], (m.shape[0], n))
    return m.ravel()


def _unary_cases() -> list[OpCase]:
    cases = []
    for name, label in (("sin", "SIN"), ("cos", "COS")):
        for type in (F32, F16, BF16):
            for ne in ([10, 2, 2, 2], [1, 1, 1, 1], [7, 5, 3, 1]):
                def build(ctx: Context, name: str = name, type: GGMLType = type, ne: list[int] = ne) -> Tensor:
                    return op(ctx, name)(new(ctx, "a", type, ne))

                cases.append(OpCase(label, f"type={_t(type)},ne={_ne(ne)}", build, {"a": uniform(-6.0, 6.0)}))

        def build_nc(ctx: Context, name: str = name) -> Tensor:
            return op(ctx, name)(permuted(ctx, "a", F32, [6, 5, 4, 3], (0, 2, 1, 3)))

        cases.append(OpCase(label, "type=f32,ne=[6,5,4,3],permuted", build_nc, {"a": uniform(-6.0, 6.0)}))

        def build_inplace(ctx: Context, name: str = name) -> Tensor:
            return op(ctx, name + "_inplace")(new(ctx, "a", F32, [9, 4, 1, 1]))

        cases.append(OpCase(label, "type=f32,ne=[9,4,1,1],inplace", build_inplace, {"a": uniform(-6.0, 6.0)}))
    return cases


def _generator_cases() -> list[OpCase]:
    cases = []
    for type in (F32, F16):
        for c in (0.0, 2.5, -7.25):
            def build_fill(ctx: Context, type: GGMLType = type, c: float = c) -> Tensor:
                return op(ctx, "fill")(new(ctx, "a", type, [10, 3, 2, 1]), c)

            cases.append(OpCase("FILL", f"type={_t(type)},ne=[10,3,2,1],c={c}", build_fill))

    def build_fill_inplace(ctx: Context) -> Tensor:
        return op(ctx, "fill_inplace")(new(ctx, "a", F32, [1, 1, 1, 1]), 3.0)

    cases.append(OpCase("FILL", "type=f32,ne=[1,1,1,1],c=3,inplace", build_fill_inplace))
    for start, stop, step in ((0.0, 3.0, 1.0), (0.0, 10.0, 1.0), (-2.5, 7.0, 0.7), (1.0, 1.5, 1.0)):
        def build_arange(ctx: Context, start: float = start, stop: float = stop, step: float = step) -> Tensor:
            return op(ctx, "arange")(start, stop, step)

        cases.append(OpCase("ARANGE", f"start={start},stop={stop},step={step}", build_arange))
    for dim, max_period, n in ((320, 10000, 2), (15, 100, 5), (1, 10000, 1)):
        def build_ts(ctx: Context, dim: int = dim, max_period: int = max_period, n: int = n) -> Tensor:
            return op(ctx, "timestep_embedding")(new(ctx, "t", F32, [n, 1, 1, 1]), dim, max_period)

        cases.append(OpCase("TIMESTEP_EMBEDDING", f"ne_t=[{n},1,1,1],dim={dim},max_period={max_period}", build_ts,
                            {"t": uniform(0.0, 50.0)}))
    return cases


def _row_cases() -> list[OpCase]:
    cases = []
    for tt in TriType:
        for ne in ([8, 8, 3, 2], [1, 1, 1, 1], [5, 5, 1, 1]):
            def build_tri(ctx: Context, tt: TriType = tt, ne: list[int] = ne) -> Tensor:
                return op(ctx, "tri")(new(ctx, "a", F32, ne), tt)

            cases.append(OpCase("TRI", f"type={tt.name},ne={_ne(ne)}", build_tri))
    for ne in ([10, 5, 4, 3], [1, 1, 1, 1], [127, 3, 1, 1]):
        def build_cumsum(ctx: Context, ne: list[int] = ne) -> Tensor:
            return op(ctx, "cumsum")(new(ctx, "a", F32, ne))

        cases.append(OpCase("CUMSUM", f"ne={_ne(ne)}", build_cumsum))

    def build_cumsum_nc(ctx: Context) -> Tensor:
        return op(ctx, "cumsum")(permuted(ctx, "a", F32, [9, 5, 4, 3], (0, 2, 1, 3)))

    cases.append(OpCase("CUMSUM", "ne=[9,5,4,3],permuted", build_cumsum_nc))
    # ggml's kernel walks rows right only for ne[2] == ne[3] == 1 (its i01 formula), as test-backend-ops' case
    for ne in ([4, 500, 1, 1], [1, 1, 1, 1], [7, 3, 1, 1]):
        def build_count(ctx: Context, ne: list[int] = ne) -> Tensor:
            return op(ctx, "count_equal")(new(ctx, "a", I32, ne), new(ctx, "b", I32, ne))

        cases.append(OpCase("COUNT_EQUAL", f"type=i32,ne={_ne(ne)}", build_count,
                            {"a": indices(3), "b": indices(3)}))
    for ne, eps in (([64, 5, 4, 3], 1e-12), ([7, 3, 1, 1], 1e-6), ([1, 1, 1, 1], 1e-12), ([5, 2, 1, 1], 10.0)):
        def build_l2(ctx: Context, ne: list[int] = ne, eps: float = eps) -> Tensor:
            return op(ctx, "l2_norm")(new(ctx, "a", F32, ne), eps)

        cases.append(OpCase("L2_NORM", f"type=f32,ne={_ne(ne)},eps={eps}", build_l2))

    def build_l2_nc(ctx: Context) -> Tensor:
        return op(ctx, "l2_norm")(permuted(ctx, "a", F32, [6, 5, 4, 3], (1, 0, 2, 3)), 1e-12)

    cases.append(OpCase("L2_NORM", "type=f32,ne=[6,5,4,3],transposed", build_l2_nc))

    def build_l2_inplace(ctx: Context) -> Tensor:
        return op(ctx, "l2_norm_inplace")(new(ctx, "a", F32, [9, 4, 1, 1]), 1e-12)

    cases.append(OpCase("L2_NORM", "type=f32,ne=[9,4,1,1],inplace", build_l2_inplace))
    return cases


def _layout_cases() -> list[OpCase]:
    cases = []
    for shifts in ((0, 0, 0, 0), (3, -1, 2, 1), (-9, 4, -3, 0), (1, 0, 0, 0)):
        def build_roll(ctx: Context, shifts: tuple[int, int, int, int] = shifts) -> Tensor:
            return op(ctx, "roll")(new(ctx, "a", F32, [10, 5, 4, 3]), *shifts)

        cases.append(OpCase("ROLL", f"ne=[10,5,4,3],shifts={list(shifts)}", build_roll))

    def build_roll_nc(ctx: Context) -> Tensor:
        return op(ctx, "roll")(permuted(ctx, "a", F32, [7, 5, 4, 3], (0, 2, 1, 3)), 2, 1, -1, 1)

    cases.append(OpCase("ROLL", "ne=[7,5,4,3],permuted,shifts=[2,1,-1,1]", build_roll_nc))
    for ne, p0, p1 in (([512, 34, 2, 1], 10, 9), ([3000, 384, 4, 1], 10, 9), ([5, 3, 2, 1], 0, 4),
                       ([2, 1, 1, 1], 1, 1), ([9, 2, 1, 1], 3, 0)):
        def build_pr(ctx: Context, ne: list[int] = ne, p0: int = p0, p1: int = p1) -> Tensor:
            return op(ctx, "pad_reflect_1d")(new(ctx, "a", F32, ne), p0, p1)

        cases.append(OpCase("PAD_REFLECT_1D", f"ne={_ne(ne)},pad=[{p0},{p1}]", build_pr))
    for ne, nr in (([10, 5, 4, 3], [2, 1, 1, 1]), ([10, 5, 4, 3], [1, 2, 1, 1]), ([10, 5, 4, 3], [1, 1, 2, 1]),
                   ([10, 5, 4, 3], [1, 1, 1, 2]), ([3, 2, 1, 1], [3, 2, 4, 2]), ([1, 1, 1, 1], [5, 1, 3, 1]),
                   ([4, 3, 2, 1], [1, 1, 1, 1])):
        def build_rb(ctx: Context, ne: list[int] = ne, nr: list[int] = nr) -> Tensor:
            a = new(ctx, "a", F32, [n * r for n, r in zip(ne, nr, strict=True)])
            return op(ctx, "repeat_back")(a, new(ctx, "b", F32, ne))

        cases.append(OpCase("REPEAT_BACK", f"ne={_ne(ne)},nr={_ne(nr)}", build_rb))

    def build_rb_nc(ctx: Context) -> Tensor:
        a = permuted(ctx, "a", F32, [8, 6, 4, 2], (0, 2, 1, 3))
        return op(ctx, "repeat_back")(a, new(ctx, "b", F32, [4, 3, 2, 1]))

    cases.append(OpCase("REPEAT_BACK", "ne=[4,3,2,1],nr=[2,2,2,2],src0 permuted", build_rb_nc))
    return cases


def _solve_cases() -> list[OpCase]:
    cases = []
    for n, k, b2, b3 in ((10, 3, 1, 1), (64, 64, 4, 2), (1, 1, 1, 1), (7, 1, 3, 1), (30, 17, 2, 3)):
        def build_solve(ctx: Context, n: int = n, k: int = k, b2: int = b2, b3: int = b3) -> Tensor:
            a = new(ctx, "a", F32, [n, n, b2, b3])
            return op(ctx, "solve_tri")(a, new(ctx, "b", F32, [k, n, b2, b3]), True, True, False)

        inits: dict[str, Init] = {"a": lower_tri_system}
        cases.append(OpCase("SOLVE_TRI", f"ne_lhs=[{n},{n},{b2},{b3}],ne_rhs=[{k},{n},{b2},{b3}]", build_solve,
                            inits))
    return cases


def _conv_cases() -> list[OpCase]:
    cases = []  # CONV_2D's cases are test-backend-ops': cases_backend_ops
    for kt in (F32, F16):
        for cwhn in (False, True):
            for kne, ine, spd in (([3, 3, 1, 4], [10, 8, 4, 2], (1, 1, 1, 1, 1, 1)),
                                  ([3, 2, 1, 3], [11, 9, 3, 1], (2, 1, 0, 2, 2, 1)),
                                  ([1, 1, 1, 1], [4, 3, 1, 1], (1, 1, 0, 0, 1, 1))):
                def build_dw(ctx: Context, kt: GGMLType = kt, cwhn: bool = cwhn, kne: list[int] = kne,
                             ine: list[int] = ine, spd: tuple[int, ...] = spd) -> Tensor:
                    if cwhn:  # channels innermost, as test-backend-ops lays them
                        x = permuted(ctx, "x", F32, ine, (2, 0, 1, 3))
                        kernel = permuted(ctx, "kernel", kt, kne, (3, 2, 0, 1))
                    else:
                        x, kernel = new(ctx, "x", F32, ine), new(ctx, "kernel", kt, kne)
                    return op(ctx, "conv_2d_dw_direct")(kernel, x, *spd)

                cases.append(OpCase("CONV_2D_DW", f"type_kernel={_t(kt)},ne_kernel={_ne(kne)},ne_input={_ne(ine)},"
                                                  f"spd={list(spd)},cwhn={int(cwhn)}", build_dw))
    # kernel [KW, KH, OC, IC], input [W, H, IC, N]
    for kt in (F32, F16):
        for kne, ine, stride in (([3, 2, 5, 4], [6, 5, 4, 2], 1), ([3, 3, 2, 3], [4, 7, 3, 1], 2),
                                 ([2, 3, 1, 1], [5, 1, 1, 1], 3), ([1, 1, 3, 2], [3, 4, 2, 2], 2)):
            def build_ct(ctx: Context, kt: GGMLType = kt, kne: list[int] = kne, ine: list[int] = ine,
                         stride: int = stride) -> Tensor:
                return op(ctx, "conv_transpose_2d_p0")(new(ctx, "kernel", kt, kne), new(ctx, "x", F32, ine), stride)

            cases.append(OpCase("CONV_TRANSPOSE_2D", f"type_kernel={_t(kt)},ne_kernel={_ne(kne)},ne_input={_ne(ine)},"
                                                     f"stride={stride}", build_ct))
    return cases

def adamw_hparams(rng: np.random.Generator, t: Tensor) -> np.ndarray:
    """alpha, beta1, beta2, eps, wd, beta1h, beta2h of an AdamW step at iteration 3."""
    alpha, beta1, beta2, eps, wd, it = 1e-3, 0.9, 0.999, 1e-8, 0.1, 3
    return np.array([alpha, beta1, beta2, eps, wd, 1 / (1 - beta1**it), 1 / (1 - beta2**it)], dtype=np.float32)


def _train_cases() -> list[OpCase]:
    cases = []
    for type in (F32, F16):
        for ne in ([64, 5, 4, 3], [7, 3, 1, 1], [1, 1, 1, 1]):
            def build_silu_back(ctx: Context, type: GGMLType = type, ne: list[int] = ne) -> Tensor:
                return op(ctx, "silu_back")(new(ctx, "dy", type, ne), new(ctx, "x", type, ne))

            cases.append(OpCase("SILU_BACK", f"type={_t(type)},ne={_ne(ne)}", build_silu_back,
                                {"x": uniform(-4.0, 4.0)}))
    for ne, eps in (([64, 5, 4, 3], 1e-6), ([7, 3, 2, 1], 1e-3), ([1, 1, 1, 1], 0.5)):  # n=1: a small eps cancels
        def build_rms_back(ctx: Context, ne: list[int] = ne, eps: float = eps) -> Tensor:
            return op(ctx, "rms_norm_back")(new(ctx, "dz", F32, ne), new(ctx, "x", F32, ne), eps)

        cases.append(OpCase("RMS_NORM_BACK", f"type=f32,ne={_ne(ne)},eps={eps}", build_rms_back))
    for ne, scale in (([16, 16, 1, 1], 1.0), ([32, 5, 4, 3], 0.1), ([7, 3, 1, 1], 2.5), ([1, 1, 1, 1], 1.0)):
        def build_sm_back(ctx: Context, ne: list[int] = ne, scale: float = scale) -> Tensor:
            return op(ctx, "soft_max_ext_back")(new(ctx, "dy", F32, ne), new(ctx, "y", F32, ne), scale, 0.0)

        cases.append(OpCase("SOFT_MAX_BACK", f"type=f32,ne={_ne(ne)},scale={scale}", build_sm_back,
                            {"y": uniform(0.0, 1.0)}))

    def build_sm_back_inplace(ctx: Context) -> Tensor:
        return op(ctx, "soft_max_ext_back_inplace")(new(ctx, "dy", F32, [9, 4, 2, 1]), new(ctx, "y", F32, [9, 4, 2, 1]),
                                                    0.5, 0.0)

    cases.append(OpCase("SOFT_MAX_BACK", "type=f32,ne=[9,4,2,1],scale=0.5,inplace", build_sm_back_inplace,
                        {"y": uniform(0.0, 1.0)}))
    for type in (F32, F16):
        for nc, n_idx, n_rows in ((10, 5, 3), (7, 1, 1), (16, 12, 4)):
            def build_grb(ctx: Context, type: GGMLType = type, nc: int = nc, n_idx: int = n_idx,
                          n_rows: int = n_rows) -> Tensor:
                return op(ctx, "get_rows_back")(new(ctx, "g", type, [nc, n_idx, 1, 1]),
                                                new(ctx, "idx", I32, [n_idx, 1, 1, 1]),
                                                new(ctx, "like", F32, [nc, n_rows, 1, 1]))

            cases.append(OpCase("GET_ROWS_BACK", f"type={_t(type)},n={nc},n_idx={n_idx},rows={n_rows}", build_grb,
                                {"idx": indices(n_rows)}))
    for ne in ([10, 5, 4, 3], [30000, 1, 1, 1], [1, 1, 1, 1], [7, 3, 1, 1]):
        def build_ce(ctx: Context, ne: list[int] = ne) -> Tensor:
            return op(ctx, "cross_entropy_loss")(new(ctx, "logits", F32, ne), new(ctx, "labels", F32, ne))

        cases.append(OpCase("CROSS_ENTROPY_LOSS", f"type=f32,ne={_ne(ne)}", build_ce,
                            {"logits": uniform(-4.0, 4.0), "labels": uniform(0.0, 1.0)}))

        def build_ce_back(ctx: Context, ne: list[int] = ne) -> Tensor:
            return op(ctx, "cross_entropy_loss_back")(new(ctx, "grad", F32, [1, 1, 1, 1]),
                                                      new(ctx, "logits", F32, ne), new(ctx, "labels", F32, ne))

        cases.append(OpCase("CROSS_ENTROPY_LOSS_BACK", f"type=f32,ne={_ne(ne)}", build_ce_back,
                            {"logits": uniform(-4.0, 4.0), "labels": uniform(0.0, 1.0)}))
    for ne in ([10, 5, 4, 3], [1, 1, 1, 1], [17, 3, 1, 1]):
        def build_adamw(ctx: Context, ne: list[int] = ne) -> Tensor:
            a = new(ctx, "a", F32, ne).set_param()
            return op(ctx, "opt_step_adamw")(a, new(ctx, "grad", F32, ne), new(ctx, "m", F32, ne),
                                             new(ctx, "v", F32, ne), new(ctx, "adamw_params", F32, [7, 1, 1, 1]))

        cases.append(OpCase("OPT_STEP_ADAMW", f"type=f32,ne={_ne(ne)}", build_adamw,
                            {"v": uniform(0.0, 1.0), "adamw_params": adamw_hparams}))

        def build_sgd(ctx: Context, ne: list[int] = ne) -> Tensor:
            a = new(ctx, "a", F32, ne).set_param()
            return op(ctx, "opt_step_sgd")(a, new(ctx, "grad", F32, ne), new(ctx, "sgd_params", F32, [2, 1, 1, 1]))

        cases.append(OpCase("OPT_STEP_SGD", f"type=f32,ne={_ne(ne)}", build_sgd,
                            {"sgd_params": lambda rng, t: np.array([0.05, 0.1], dtype=np.float32)}))
    return cases

def misc_cases() -> list[OpCase]:
    return (_unary_cases() + _generator_cases() + _row_cases() + _layout_cases() + _solve_cases()
            + _conv_cases() + _train_cases())
