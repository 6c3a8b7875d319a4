"""The decoder graph of every family in pyggml.models.arch, as llama.cpp 0c1e570 builds it (DESIGN.md,
"The decoder graph", has it as pseudo-code). LLaMA files use RoPE's normal mode because llama.cpp's converter
permutes their wq/wk rows to interleaved pairs; the other families keep HF's layout and use NEOX."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from pyggml.core.context import Context
from pyggml.core.errors import ArgumentError
from pyggml.core.graph import Graph
from pyggml.core.ops.attention import flash_attn_ext_add_sinks, flash_attn_ext_set_prec
from pyggml.core.ops.norm import soft_max_add_sinks
from pyggml.core.tensor import GGMLOp, Prec, Tensor
from pyggml.core.types import GGMLType
from pyggml.models.arch import (
    FFN_GEGLU,
    FFN_SWIGLU_FUSED,
    FFN_SWIGLU_OAI,
    GATING_SOFTMAX,
    QK_NORM_ALL,
    QK_NORM_HEAD,
    RECURRENT_SHORTCONV,
    SWIGLU_OAI_ALPHA,
    SWIGLU_OAI_LIMIT,
    HParams,
)
from pyggml.models.attn_rot import mul_mat_hadamard
from pyggml.models.kv_cache import KVCache
from pyggml.models.recurrent_state import RecurrentState, StateInputs

CTX_PAD = 256  # llama.cpp pads the context to a multiple of 256 (llama_context: GGML_PAD(n_ctx, 256))


@dataclass
class GraphInputs:
    """The graph's input tensors (set before computing) and its output."""

    tokens: Tensor  # I32 [n_tokens]
    pos: Tensor  # I32 [n_tokens]
    mask: Tensor  # F32 [n_kv, n_tokens] (F16 with flash attention): 0 where a token sees a cell, -inf elsewhere
    logits: Tensor  # F32 [n_vocab, n_outputs]; an embeddings graph's output norm result [n_embd, n_outputs]
    k_idxs: Tensor | None  # I64 [n_tokens]: the K cache rows (cells) this batch goes to (None: CPY idiom)
    v_idxs: Tensor | None  # I64 [n_tokens] or [n_embd_gqa * n_tokens] (V transposed): the V cache rows
    kv_writes: list[Tensor]  # the SET_ROWS (or CPY) nodes storing this batch's K and V
    layer_nodes: list[list[Tensor]] = field(default_factory=list)  # per layer, to name where a NaN starts
    # each layer's RMS_NORMs, pinned to the layer's backend as llama.cpp's graph callback pins them
    norms: list[tuple[int, Tensor]] = field(default_factory=list)
    mask_swa: Tensor | None = None  # the sliding-window layers' mask; None when no layer slides
    out_ids: Tensor | None = None  # I32 [n_outputs] (llama.cpp's inp_out_ids); None: every token
    rs: StateInputs | None = None  # the recurrent state's cell of the batch's sequence; None: no recurrent layer


def _f32(x: float) -> float:
    """x rounded to float32, as llama.cpp computes its scale factors."""
    return float(np.float32(x))


class _Builder:

    def __init__(self, ctx: Context, hp: HParams, w: dict[str, Tensor], kv: KVCache, n_tokens: int, n_past: int,
                 n_kv: int, flash_attn: bool, set_rows: bool, glu: bool, n_outputs: int | None = None,
                 embeddings: bool = False, rs: RecurrentState | None = None, rs_cell: tuple[int, int] = (0, -1)
                 ) -> None:
        self.ctx, self.hp, self.w, self.kv, self.rs = ctx, hp, w, kv, rs
        self.embeddings = embeddings
        self.n_tokens, self.n_past, self.n_kv = n_tokens, n_past, n_kv
        self.flash_attn, self.glu = flash_attn, glu
        self.gf = ctx.new_graph(graph_size(hp))
        self.writes: list[Tensor] = []
        self.norms: list[tuple[int, Tensor]] = []
        self.tokens = ctx.new_tensor_1d(GGMLType.I32, n_tokens).set_name("inp_tokens").set_input()
        self.pos = ctx.new_tensor_1d(GGMLType.I32, n_tokens).set_name("inp_pos").set_input()
        mask_type = GGMLType.F16 if flash_attn else GGMLType.F32
        self.mask = ctx.new_tensor_2d(mask_type, n_kv, n_tokens).set_name("KQ_mask").set_input()
        self.mask_swa = (ctx.new_tensor_2d(mask_type, n_kv, n_tokens).set_name("KQ_mask_swa").set_input()
                         if hp.any_swa else None)
        self.out_ids = (ctx.new_tensor_1d(GGMLType.I32, n_outputs).set_name("inp_out_ids").set_input()
                        if n_outputs is not None and n_outputs < n_tokens else None)
        self.rs_inp = rs.inputs(ctx, *rs_cell) if rs is not None else None
        self.k_idxs: Tensor | None = None
        self.v_idxs: Tensor | None = None
        if set_rows:
            self.k_idxs = ctx.new_tensor_1d(GGMLType.I64, n_tokens).set_name("inp_k_idxs").set_input()
            n_v_idxs = n_tokens * hp.n_embd_gqa if kv.v_trans else n_tokens
            self.v_idxs = ctx.new_tensor_1d(GGMLType.I64, n_v_idxs).set_name("inp_v_idxs").set_input()
        # llama.cpp's get_rope_factors: rope_freqs (llama3), else phi3's long or short factors by padded n_ctx
        factors = w.get("rope_freqs.weight")
        n_ctx_seq = -(-kv.n_ctx // CTX_PAD) * CTX_PAD
        self.rope_factors = factors if factors is not None else w.get(
            "rope_factors_long.weight" if n_ctx_seq > hp.n_ctx_orig else "rope_factors_short.weight")

    # --- the shared blocks ---

    def linear(self, name: str, x: Tensor, out_name: str, il: int) -> Tensor:
        y = self.ctx.mul_mat(self.w[name + ".weight"], x).set_name(f"{out_name}-{il}")
        bias = self.w.get(name + ".bias")
        return y if bias is None else self.ctx.add(y, bias).set_name(f"{out_name}-{il}")

    def norm(self, x: Tensor, weight: str, out_name: str, il: int, pin: bool = True) -> Tensor:
        """RMS norm times the weight; `pin`: computed on the layer's backend (see GraphInputs.norms)."""
        n = self.ctx.rms_norm(x, self.hp.f_norm_rms_eps).set_name(f"norm-{il}")
        if pin:
            self.norms.append((il, n))
        return self.ctx.mul(n, self.w[weight]).set_name(f"{out_name}-{il}")

    def rope(self, x: Tensor, il: int) -> Tensor:
        hp = self.hp
        base, scale = hp.rope_base_scale(il)
        return self.ctx.rope_ext(x, self.pos, self.rope_factors, hp.n_rot, hp.arch.rope_mode, hp.n_ctx_orig, base,
                                 scale, hp.rope_ext_factor, hp.rope_attn_factor, 32.0, 1.0)

    def qkv(self, h: Tensor, il: int) -> tuple[Tensor, Tensor, Tensor]:
        b, ctx, hp = f"blk.{il}.", self.ctx, self.hp
        if b + "attn_qkv.weight" not in self.w:
            return (self.linear(b + "attn_q", h, "Qcur", il), self.linear(b + "attn_k", h, "Kcur", il),
                    self.linear(b + "attn_v", h, "Vcur", il))
        qkv = self.linear(b + "attn_qkv", h, "wqkv", il)
        # contiguous copies of the three row ranges (llama.cpp ropes strided views: the same values)
        parts, off = [], 0
        for width, name in ((hp.n_embd_q, "Qcur"), (hp.n_embd_gqa, "Kcur"), (hp.n_embd_gqa, "Vcur")):
            view = ctx.view_2d(qkv, width, self.n_tokens, qkv.nb[1], off * qkv.nb[0])
            parts.append(ctx.cont(view).set_name(f"{name}-{il}"))
            off += width
        return parts[0], parts[1], parts[2]

    def softcap(self, x: Tensor, cap: float) -> Tensor:
        """cap * tanh(x / cap), as llama.cpp soft-caps logits."""
        return self.ctx.scale(self.ctx.tanh(self.ctx.scale(x, _f32(1.0 / cap))), _f32(cap))

    def attention(self, h: Tensor, il: int) -> Tensor:
        ctx, hp, kv, b = self.ctx, self.hp, self.kv, f"blk.{il}."
        head_dim, n_head, n_head_kv, n_tokens = hp.head_dim, hp.n_head, hp.n_head_kv, self.n_tokens
        q, k, v = self.qkv(h, il)
        if hp.arch.qk_norm == QK_NORM_ALL:  # olmo2: Q's and K's whole rows, before the split into heads
            q = self.norm(q, b + "attn_q_norm.weight", "Qcur_normed", il)
            k = self.norm(k, b + "attn_k_norm.weight", "Kcur_normed", il)
        q = ctx.reshape_3d(q, head_dim, n_head, n_tokens)
        k = ctx.reshape_3d(k, head_dim, n_head_kv, n_tokens)
        if hp.arch.qk_norm == QK_NORM_HEAD:
            q = self.norm(q, b + "attn_q_norm.weight", "Qcur_normed", il)
            k = self.norm(k, b + "attn_k_norm.weight", "Kcur_normed", il)
        if hp.has_rope(il):
            q = self.rope(q, il).set_name(f"Qcur-rope-{il}")
            k = self.rope(k, il).set_name(f"Kcur-rope-{il}")
        if hp.arch.scale_q:  # gemma3, phi3: Q scaled before attention, the softmax's scale 1
            q = ctx.scale(q, _f32(hp.f_attention_scale)).set_name(f"Qcur_scaled-{il}")
            kq_scale = 1.0
        else:
            kq_scale = hp.f_attention_scale or 1.0 / math.sqrt(head_dim)
        # a quantized cache's Hadamard rotations (pyggml.models.attn_rot): Q and K alike, V undone after
        k_rot, v_rot = kv.k_rot(il), kv.v_rot(il)
        if k_rot is not None:
            q = mul_mat_hadamard(ctx, q, k_rot).set_name(f"Qcur_rot-{il}")
            k = mul_mat_hadamard(ctx, k, k_rot).set_name(f"Kcur_rot-{il}")
        if v_rot is not None:
            v = mul_mat_hadamard(ctx, v, v_rot).set_name(f"Vcur_rot-{il}")
        if self.k_idxs is not None and self.v_idxs is not None:
            self.writes += kv.store(ctx, self.gf, il, k, v, n_tokens, self.k_idxs, self.v_idxs)
        else:
            self.writes += kv.store_cpy(ctx, self.gf, il, k, v, n_tokens, self.n_past)
        mask = self.mask_swa if hp.is_swa(il) and self.mask_swa is not None else self.mask

        q = ctx.permute(q, 0, 2, 1, 3)  # [head_dim, n_tokens, n_head]
        keys = kv.k_view(ctx, il, self.n_kv, head_dim, n_head_kv).set_name(f"k-{il}")
        values = kv.v_view(ctx, il, self.n_kv, head_dim, n_head_kv).set_name(f"v-{il}")
        if self.flash_attn:
            kqv = ctx.flash_attn_ext(q, keys, values, mask, kq_scale,
                                     logit_softcap=hp.f_attn_logit_softcapping).set_name(f"fattn-{il}")
            flash_attn_ext_add_sinks(kqv, self.w.get(b + "attn_sinks.weight"))
            flash_attn_ext_set_prec(kqv, Prec.F32)
            cur = ctx.reshape_2d(kqv, hp.n_embd_q, n_tokens).set_name(f"kqv_merged-{il}")  # [head_dim, n_head, ..]
        else:
            kq = ctx.mul_mat(keys, q).set_name(f"kq-{il}")  # [n_kv, n_tokens, n_head], KV heads broadcast (GQA)
            if hp.f_attn_logit_softcapping:
                kq = self.softcap(kq, hp.f_attn_logit_softcapping).set_name(f"kq_scaled_2-{il}")
            kq = ctx.soft_max_ext(kq, mask, kq_scale).set_name(f"kq_soft_max-{il}")
            soft_max_add_sinks(kq, self.w.get(b + "attn_sinks.weight"))
            kqv = ctx.mul_mat(values, kq).set_name(f"kqv-{il}")  # [head_dim, n_tokens, n_head]
            cur = ctx.cont_2d(ctx.permute(kqv, 0, 2, 1, 3), hp.n_embd_q, n_tokens).set_name(f"kqv_merged-{il}")
        if v_rot is not None:
            cur = mul_mat_hadamard(ctx, cur, v_rot).set_name(f"kqv_out_rot-{il}")
        return self.linear(b + "attn_output", cur, "attn_out", il)

    def ffn(self, h: Tensor, il: int, suffix: str = "") -> Tensor:
        """The dense FFN of ffn_{gate,up,down}`suffix` (a mixture's shared expert: "_shexp")."""
        ctx, b, kind = self.ctx, f"blk.{il}.", self.hp.arch.ffn
        up = self.linear(b + "ffn_up" + suffix, h, "ffn_up" + suffix, il)
        if kind == FFN_SWIGLU_FUSED:  # phi3: up holds [gate; up] (llama.cpp's LLM_FFN_SWIGLU, LLM_FFN_SEQ)
            if self.glu:
                cur = ctx.swiglu(up).set_name(f"ffn_swiglu-{il}")
            else:
                half = up.ne[0] // 2
                gate = ctx.cont(ctx.view_2d(up, half, up.ne[1], up.nb[1], 0))
                rest = ctx.cont(ctx.view_2d(up, half, up.ne[1], up.nb[1], half * up.nb[0]))
                cur = ctx.mul(ctx.silu(gate).set_name(f"ffn_silu-{il}"), rest)
        else:
            cur = self.glu_split(self.linear(b + "ffn_gate" + suffix, h, "ffn_gate" + suffix, il), up, "ffn", il)
        return self.linear(b + "ffn_down" + suffix, cur, "ffn_out" + suffix, il)

    def glu_split(self, gate: Tensor, up: Tensor, name: str, il: int) -> Tensor:
        """The family's activation of `gate` times `up`: one GLU op, or unary ops and a MUL."""
        ctx, gelu = self.ctx, self.hp.arch.ffn == FFN_GEGLU
        if self.hp.arch.ffn == FFN_SWIGLU_OAI:
            if self.glu:
                return ctx.swiglu_oai(gate, up, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT).set_name(f"{name}_swiglu_oai-{il}")
            x = ctx.clamp(gate, -math.inf, SWIGLU_OAI_LIMIT)
            y = ctx.clamp(up, -SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT)
            return ctx.mul(ctx.mul(x, ctx.sigmoid(ctx.scale(x, SWIGLU_OAI_ALPHA))), ctx.scale_bias(y, 1.0, 1.0))
        if self.glu:
            return (ctx.geglu_split(gate, up).set_name(f"{name}_geglu-{il}") if gelu
                    else ctx.swiglu_split(gate, up).set_name(f"{name}_swiglu-{il}"))
        act = ctx.gelu(gate).set_name(f"{name}_gelu-{il}") if gelu else ctx.silu(gate).set_name(f"{name}_silu-{il}")
        return ctx.mul(act, up)

    def experts(self, name: str, x: Tensor, selected: Tensor, out_name: str, il: int) -> Tensor:
        """MUL_MAT_ID of each token's chosen experts' matrices, plus their biases (ADD_ID) where the file has them."""
        y = self.ctx.mul_mat_id(self.w[name + ".weight"], x, selected).set_name(f"{out_name}-{il}")
        bias = self.w.get(name + ".bias")
        return y if bias is None else self.ctx.add_id(y, bias, selected).set_name(f"{out_name}_biased-{il}")

    def moe(self, h: Tensor, il: int) -> Tensor:
        """llama.cpp's build_moe_ffn as its families call it: the n_expert_used largest of the router's softmax
        (or logits, then the softmax of those: GATING_SOFTMAX_WEIGHT) by ARGSORT, their weights renormalized to
        sum 1 where the family does, each token through its experts, weighted and summed."""
        ctx, hp, b = self.ctx, self.hp, f"blk.{il}."
        n_embd, n_tokens, n_used = hp.n_embd, h.ne[1], hp.n_expert_used
        logits = self.linear(b + "ffn_gate_inp", h, "ffn_moe_logits", il)  # [n_expert, n_tokens]
        softmax_first = hp.arch.gating == GATING_SOFTMAX
        probs = ctx.soft_max(logits).set_name(f"ffn_moe_probs-{il}") if softmax_first else logits
        selected = ctx.argsort_top_k(probs, n_used).set_name(f"ffn_moe_topk-{il}")  # [n_used, n_tokens]
        weights = ctx.get_rows(ctx.reshape_3d(probs, 1, hp.n_expert, n_tokens), selected)  # [1, n_used, n_tokens]
        weights = ctx.reshape_2d(weights.set_name(f"ffn_moe_weights-{il}"), n_used, n_tokens)
        if not softmax_first:
            weights = ctx.soft_max(weights).set_name(f"ffn_moe_weights_softmax-{il}")
        if hp.arch.norm_experts:
            # F16's smallest normal number: a row of zero weights stays finite (llama.cpp's clamp)
            total = ctx.clamp(ctx.sum_rows(weights), 6.103515625e-5, math.inf).set_name(f"ffn_moe_weights_sum-{il}")
            weights = ctx.div(weights, total).set_name(f"ffn_moe_weights_norm-{il}")
        weights = ctx.reshape_3d(weights, 1, n_used, n_tokens)
        self.gf.build_forward_expand(weights)
        cur = ctx.reshape_3d(h, n_embd, 1, n_tokens)
        if b + "ffn_gate_up_exps.weight" in self.w:  # one MUL_MAT_ID, split into gate and up views
            gate_up = self.experts(b + "ffn_gate_up_exps", cur, selected, "ffn_moe_gate_up", il)
            n_ff = gate_up.ne[0] // 2
            gate = ctx.view_3d(gate_up, n_ff, gate_up.ne[1], gate_up.ne[2], gate_up.nb[1], gate_up.nb[2], 0)
            up = ctx.view_3d(gate_up, n_ff, gate_up.ne[1], gate_up.ne[2], gate_up.nb[1], gate_up.nb[2],
                             n_ff * gate_up.nb[0])
        else:
            up = self.experts(b + "ffn_up_exps", cur, selected, "ffn_moe_up", il)
            gate = self.experts(b + "ffn_gate_exps", cur, selected, "ffn_moe_gate", il)
        act = self.glu_split(gate, up, "ffn_moe", il)
        experts = self.experts(b + "ffn_down_exps", act, selected, "ffn_moe_down", il)  # [n_embd, n_used, n_tokens]
        experts = ctx.mul(experts, weights).set_name(f"ffn_moe_weighted-{il}")
        self.gf.build_forward_expand(experts)
        # the views first, then the adds (llama.cpp's order)
        views = [ctx.view_2d(experts, n_embd, n_tokens, experts.nb[2], i * experts.nb[1]) for i in range(n_used)]
        for v in views:
            self.gf.build_forward_expand(v)
        out = views[0]
        for v in views[1:]:
            out = ctx.add(out, v)
            self.gf.build_forward_expand(out)
        if n_used == 1:  # a view of one expert's rows is not contiguous
            out = ctx.cont(out)
        if hp.n_ff_shexp:  # granitemoe's shared expert, beside the chosen ones
            out = ctx.add(out.set_name(f"ffn_moe_out-{il}"), self.ffn(h, il, "_shexp"))
        return out.set_name(f"ffn_moe_out-{il}")

    def recurrent(self, h: Tensor, il: int) -> Tensor:
        """The family's block of a layer without attention, over the batch's one sequence and its state."""
        return self.shortconv(h, il) if self.hp.arch.recurrent == RECURRENT_SHORTCONV else self.mamba2(h, il)

    def conv_window(self, cur: Tensor, il: int, d_conv: int) -> Tensor:
        """The state's last `d_conv` inputs then the batch's `cur` [n_tokens, channels, 1], the new state (the
        last `d_conv` columns) written back: [d_conv + n_tokens, channels, 1]."""
        ctx, rs, inp = self.ctx, self.rs, self.rs_inp
        assert rs is not None and inp is not None
        conv = ctx.reshape_3d(rs.read(ctx, self.gf, rs.r[il], inp), d_conv, cur.ne[1], 1)
        window = ctx.concat(conv, cur, 0)
        last = ctx.view_3d(window, d_conv, window.ne[1], window.ne[2], window.nb[1], window.nb[2],
                           (window.ne[0] - d_conv) * window.nb[0])
        rs.write(ctx, self.gf, rs.r[il], last, inp)
        return window

    def shortconv(self, h: Tensor, il: int) -> Tensor:
        """lfm2's short convolution (llama.cpp's build_shortconv_block): B, C, x = in_proj(h); C * conv(B * x)."""
        ctx, b, n_tokens = self.ctx, f"blk.{il}.", self.n_tokens
        bcx = ctx.mul_mat(self.w[b + "shortconv.in_proj.weight"], ctx.reshape_3d(h, h.ne[0], n_tokens, 1))
        bcx.set_name(f"model.layers.{il}.conv.in_proj")
        n = bcx.ne[0] // 3
        gate, c, x = (ctx.view_3d(bcx, n, bcx.ne[1], bcx.ne[2], bcx.nb[1], bcx.nb[2], i * n * bcx.nb[0])
                      for i in range(3))
        window = self.conv_window(ctx.transpose(ctx.mul(gate, x)), il, self.hp.n_shortconv_l_cache - 1)
        conv = ctx.ssm_conv(window, self.w[b + "shortconv.conv.weight"]).set_name(f"model.layers.{il}.conv.conv")
        y = ctx.mul_mat(self.w[b + "shortconv.out_proj.weight"], ctx.mul(c, conv))
        return ctx.reshape_2d(y, y.ne[0], n_tokens).set_name(f"model.layers.{il}.conv.out_proj")

    def mamba2(self, h: Tensor, il: int) -> Tensor:
        """Mamba-2 (llama.cpp's build_mamba2_layer, one sequence): z, xBC, dt = ssm_in(h); xBC through the causal
        conv and SiLU; SSM_SCAN of x, dt, A, B, C by groups from the state; + D x; gated by z; grouped RMS norm."""
        ctx, hp, w, b, n_tokens = self.ctx, self.hp, self.w, f"blk.{il}.", self.n_tokens
        rs, inp = self.rs, self.rs_inp
        assert rs is not None and inp is not None
        d_inner, d_state, n_head, n_group = hp.ssm_d_inner, hp.ssm_d_state, hp.ssm_dt_rank, hp.ssm_n_group
        head_dim, d_xbc = d_inner // n_head, d_inner + 2 * n_group * d_state
        zxbcdt = ctx.reshape_3d(ctx.mul_mat(w[b + "ssm_in.weight"], h), d_xbc + d_inner + n_head, n_tokens, 1)
        nb1, nb2, es = zxbcdt.nb[1], zxbcdt.nb[2], zxbcdt.nb[0]
        z = ctx.view_4d(zxbcdt, head_dim, n_head, n_tokens, 1, head_dim * es, nb1, nb2, 0)
        xbc = ctx.view_3d(zxbcdt, d_xbc, n_tokens, 1, nb1, nb2, d_inner * es)
        dt = ctx.view_3d(zxbcdt, n_head, n_tokens, 1, nb1, nb2, (d_inner + d_xbc) * es)
        window = self.conv_window(ctx.transpose(xbc), il, hp.ssm_d_conv - 1)
        xbc = ctx.ssm_conv(window, w[b + "ssm_conv1d.weight"])
        if b + "ssm_conv1d.bias" in w:
            xbc = ctx.add(xbc, w[b + "ssm_conv1d.bias"])
        xbc = ctx.silu(xbc)
        nb1, nb2, es = xbc.nb[1], xbc.nb[2], xbc.nb[0]
        x = ctx.view_4d(xbc, head_dim, n_head, n_tokens, 1, head_dim * es, nb1, nb2, 0)
        B = ctx.view_4d(xbc, d_state, n_group, n_tokens, 1, d_state * es, nb1, nb2, d_inner * es)
        C = ctx.view_4d(xbc, d_state, n_group, n_tokens, 1, d_state * es, nb1, nb2, (d_inner + n_group * d_state) * es)
        dt = ctx.add(ctx.cont(dt), w[b + "ssm_dt.bias"])

        def scan(ctx: Context, states: Tensor, ids: Tensor) -> Tensor:
            s = ctx.reshape_4d(states, d_state, head_dim, n_head, states.ne[1])
            return ctx.ssm_scan(s, x, dt, w[b + "ssm_a"], B, C, ids, 1)

        y_ssm = rs.read(ctx, self.gf, rs.s[il], inp, scan)
        rs.write(ctx, self.gf, rs.s[il], ctx.view_1d(y_ssm, hp.n_embd_s, x.nelements() * y_ssm.nb[0]), inp)
        xs = x.nb[1]
        y = ctx.view_4d(y_ssm, head_dim, n_head, n_tokens, 1, xs, n_head * xs, n_tokens * n_head * xs, 0)
        y = ctx.add(y, ctx.mul(x, w[b + "ssm_d"])).set_name(f"mamba2_y_add_d-{il}")
        z = ctx.cont(z)
        y = ctx.swiglu_split(z, y) if self.glu else ctx.mul(ctx.silu(z), y)
        y = self.norm(ctx.reshape_4d(y, d_inner // n_group, n_group, n_tokens, 1), b + "ssm_norm.weight",
                      "ssm_norm", il)
        return ctx.mul_mat(w[b + "ssm_out.weight"], ctx.reshape_2d(y, d_inner, n_tokens)).set_name(f"mamba_out-{il}")

    def layer(self, x: Tensor, il: int) -> Tensor:
        b, hp = f"blk.{il}.", self.hp
        pre, post, residual_scale = hp.arch.pre_norms, hp.arch.post_norms, hp.f_residual_scale
        h = self.norm(x, b + "attn_norm.weight", "attn_norm", il) if pre else x
        a = self.recurrent(h, il) if hp.is_recurrent(il) else self.attention(h, il)
        if post:
            a = self.norm(a, b + "post_attention_norm.weight", "attn_post_norm", il)
        if residual_scale:  # granite
            a = self.ctx.scale(a, _f32(residual_scale))
        x = self.ctx.add(a, x).set_name(f"ffn_inp-{il}")
        h = self.norm(x, b + hp.arch.ffn_norm + ".weight", "ffn_norm", il) if pre else x
        f = self.moe(h, il) if hp.n_expert else self.ffn(h, il)
        if post:  # llama.cpp builds this norm without a layer index: its callback does not pin it
            f = self.norm(f, b + "post_ffw_norm.weight", "ffn_post_norm", il, pin=False)
        if residual_scale:
            f = self.ctx.scale(f, _f32(residual_scale))
        return self.ctx.add(f, x).set_name(f"l_out-{il}")

    def build(self, last_only: bool) -> tuple[Graph, GraphInputs]:
        ctx, hp = self.ctx, self.hp
        x = ctx.get_rows(self.w["token_embd.weight"], self.tokens).set_name("inp_embd")
        if hp.arch.embd_scale:
            x = ctx.scale(x, _f32(math.sqrt(hp.n_embd))).set_name("inp_scaled")
        if hp.f_embedding_scale:  # granite
            x = ctx.scale(x, _f32(hp.f_embedding_scale)).set_name("inp_scaled")
        self.layer_nodes: list[list[Tensor]] = []
        for il in range(hp.n_layer):
            first_tensor = len(ctx.tensors)
            x = self.layer(x, il)
            self.layer_nodes.append([t for t in ctx.tensors[first_tensor:] if t.op != GGMLOp.NONE])
        if self.out_ids is not None:
            x = ctx.get_rows(x, self.out_ids).set_name("out_rows")
        elif last_only and self.n_tokens > 1:
            x = ctx.view_2d(x, hp.n_embd, 1, x.nb[1], (self.n_tokens - 1) * x.nb[1]).set_name("last_token")
        cur = ctx.mul(ctx.rms_norm(x, hp.f_norm_rms_eps), self.w[hp.arch.output_norm + ".weight"]).set_name(
            "result_norm")
        if self.embeddings:  # llama.cpp's t_embd: the hidden states the head would read
            return self._finish(cur)
        head = self.w.get("output.weight", self.w["token_embd.weight"])  # tied embeddings when the file has none
        logits = ctx.mul_mat(head, cur)
        if "output.bias" in self.w:
            logits = ctx.add(logits, self.w["output.bias"])
        if hp.f_final_logit_softcapping:
            logits = self.softcap(logits, hp.f_final_logit_softcapping)
        if hp.f_logit_scale:  # granite
            logits = ctx.scale(logits, _f32(1.0 / hp.f_logit_scale))
        return self._finish(logits.set_name("result_output"))

    def _finish(self, out: Tensor) -> tuple[Graph, GraphInputs]:
        out.set_output()
        self.gf.build_forward_expand(out)
        return self.gf, GraphInputs(self.tokens, self.pos, self.mask, out, self.k_idxs, self.v_idxs, self.writes,
                                    self.layer_nodes, self.norms, self.mask_swa, self.out_ids, self.rs_inp)


def build_graph(ctx: Context, hp: HParams, w: dict[str, Tensor], kv: KVCache, n_tokens: int, n_past: int,
                last_only: bool = False, n_kv: int | None = None, flash_attn: bool = False, set_rows: bool = True,
                glu: bool = True, n_outputs: int | None = None, embeddings: bool = False,
                rs: RecurrentState | None = None, rs_cell: tuple[int, int] = (0, -1)) -> tuple[Graph, GraphInputs]:
    """The graph of one batch of `n_tokens` at positions n_past.., attending to cells 0..n_kv.

    `last_only`/`n_outputs`: logits of the last token / of the tokens `out_ids` names; `flash_attn` needs
    `kv.v_trans` False; without `set_rows` K and V are written by CPY into views at n_past, without `glu`
    the activation is a unary op and a MUL (for backends lacking SET_ROWS or GLU); `embeddings`: the output
    is `result_norm`, not the logits. A model with recurrent layers takes its state `rs` and the batch's one
    sequence's (cell, cell to zero or -1)."""
    if n_kv is None:
        n_kv = n_past + n_tokens
    if not n_past + n_tokens <= n_kv <= kv.n_ctx:
        raise ArgumentError(f"build_graph: n_kv {n_kv} must cover n_past {n_past} + n_tokens {n_tokens} "
                            f"and fit n_ctx {kv.n_ctx}")
    if flash_attn == kv.v_trans:
        raise ArgumentError(f"build_graph: flash_attn={flash_attn} needs a KV cache with v_trans={not flash_attn}")
    if hp.any_recurrent and rs is None:
        raise ArgumentError(f"build_graph: {hp.arch.name}'s recurrent layers need a recurrent state")
    return _Builder(ctx, hp, w, kv, n_tokens, n_past, n_kv, flash_attn, set_rows, glu, n_outputs,
                    embeddings, rs, rs_cell).build(last_only)


def graph_size(hp: HParams) -> int:
    """Nodes + leafs a graph needs at most."""
    return max(2048, (96 + 4 * hp.n_expert_used) * hp.n_layer + 64)
