"""Architectures as data (llama.cpp's src/llama-arch.cpp, src/models/<arch>.cpp): one `Arch` row per family of
the one decoder pyggml.models.graph builds, and `HParams`, llama.cpp's `llama_hparams` read from GGUF.
DESIGN.md, "Model families", tabulates the rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from pyggml.core.types import QUANT_WEIGHT_TYPES, GGMLType
from pyggml.gguf.reader import GGUFFile
from pyggml.models.metadata import INT32_MAX, ModelFileError, gguf_type, read_bool, read_float, read_int, read_str

ROPE_MODE_NORMAL = 0  # pairs of adjacent elements
ROPE_MODE_NEOX = 2  # pairs n_rot/2 apart (HF's rotate_half)

FFN_SWIGLU = "swiglu"  # silu(gate @ x) * (up @ x)
FFN_GEGLU = "geglu"  # gelu_tanh(gate @ x) * (up @ x)
FFN_SWIGLU_FUSED = "swiglu_fused"  # one ffn_up of 2 * n_ff rows: silu(first half) * second half (phi3)
FFN_SWIGLU_OAI = "swiglu_oai"  # ggml_swiglu_oai(gate, up, 1.702, 7): gpt-oss's clamped SwiGLU
SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT = 1.702, 7.0

GATING_SOFTMAX = "softmax"
GATING_SOFTMAX_WEIGHT = "softmax_weight"

# RMS norms of Q and K before RoPE: of each head (attn_q_norm of head_dim), of whole rows (of n_embd_q: olmo2)
QK_NORM_HEAD = "head"
QK_NORM_ALL = "all"

RECURRENT_SHORTCONV = "shortconv"  # lfm2: in_proj to B, C, x; C * conv(B * x) over a window of l_cache tokens
RECURRENT_MAMBA2 = "mamba2"  # granitehybrid: Mamba-2's SSM_CONV, SSM_SCAN with groups, D, a gated grouped RMS norm


@dataclass(frozen=True)
class Arch:
    name: str
    rope_mode: int = ROPE_MODE_NORMAL
    qk_norm: str = ""
    pre_norms: bool = True
    post_norms: bool = False  # RMS norms of the attention and FFN outputs before each residual add
    qkv_bias: bool = False  # biases required (others use them where present)
    ffn: str = FFN_SWIGLU
    embd_scale: bool = False  # the token embeddings times sqrt(n_embd)
    scale_q: bool = False  # Q scaled before attention (softmax scale 1)
    swa_pattern: int = 0  # of each n layers the last is global (0: no window)
    n_swa_default: int = 0
    swa_rope_is_global: bool = False  # the sliding layers' rope defaults to the global one (else base 10000)
    attn_softcap: bool = False  # cap * tanh(kq / cap); gemma2's caps default to llama.cpp's 50 and 30
    no_rope_layer_step: int = 0
    granite_scales: bool = False
    # gemma3 27B (62 layers, as llama.cpp tells it) scales Q by 1/sqrt(n_embd/n_head)
    q_scale_by_embd_layers: int = 0
    experts: bool = False  # every layer's FFN is a mixture of experts (others: where the file counts experts)
    gating: str = GATING_SOFTMAX
    norm_experts: bool = True
    ffn_norm: str = "ffn_norm"  # the FFN's input norm (gpt-oss: post_attention_norm)
    attn_sinks: bool = False  # attn_sinks of n_head: one more logit per head in each softmax row
    recurrent: str = ""  # RECURRENT_*: the block of the layers of 0 KV heads (llama.cpp's is_recr)
    output_norm: str = "output_norm"  # the final norm's tensor (lfm2: token_embd_norm)


ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("llama"),
    Arch("qwen2", rope_mode=ROPE_MODE_NEOX, qkv_bias=True),
    Arch("qwen3", rope_mode=ROPE_MODE_NEOX, qk_norm=QK_NORM_HEAD),
    Arch("gemma3", rope_mode=ROPE_MODE_NEOX, qk_norm=QK_NORM_HEAD, post_norms=True, ffn=FFN_GEGLU, embd_scale=True,
         scale_q=True, swa_pattern=6, q_scale_by_embd_layers=62),
    Arch("phi3", rope_mode=ROPE_MODE_NEOX, ffn=FFN_SWIGLU_FUSED, scale_q=True),
    Arch("qwen3moe", rope_mode=ROPE_MODE_NEOX, qk_norm=QK_NORM_HEAD, experts=True),
    Arch("olmo2", rope_mode=ROPE_MODE_NEOX, qk_norm=QK_NORM_ALL, pre_norms=False, post_norms=True),
    Arch("gemma2", rope_mode=ROPE_MODE_NEOX, post_norms=True, ffn=FFN_GEGLU, embd_scale=True, scale_q=True,
         swa_pattern=2, n_swa_default=4096, swa_rope_is_global=True, attn_softcap=True, q_scale_by_embd_layers=46),
    Arch("smollm3", no_rope_layer_step=4),
    Arch("granite", granite_scales=True),
    Arch("granitemoe", granite_scales=True),
    Arch("gpt-oss", rope_mode=ROPE_MODE_NEOX, qkv_bias=True, ffn=FFN_SWIGLU_OAI, swa_pattern=2,
         swa_rope_is_global=True, experts=True, gating=GATING_SOFTMAX_WEIGHT, norm_experts=False,
         ffn_norm="post_attention_norm", attn_sinks=True),
    Arch("lfm2", rope_mode=ROPE_MODE_NEOX, qk_norm=QK_NORM_HEAD, recurrent=RECURRENT_SHORTCONV,
         output_norm="token_embd_norm"),
    Arch("granitehybrid", granite_scales=True, recurrent=RECURRENT_MAMBA2),
)}

# the types ggml's CPU multiplies by: the float types and every quantized type but src1's partners Q8_1 and Q8_K
WEIGHT_TYPES: tuple[GGMLType, ...] = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, *QUANT_WEIGHT_TYPES)


def arch_of(gf: GGUFFile) -> Arch:
    name = read_str(gf, "general.architecture")
    if name not in ARCHS:
        raise ModelFileError(f"'{gf.name}': unsupported architecture {name!r} (supported: {', '.join(ARCHS)})")
    return ARCHS[name]


def _n_vocab(gf: GGUFFile) -> int:
    """llama.cpp's n_vocab: the length of the tokenizer's token list, else the rows of token_embd."""
    key = "tokenizer.ggml.tokens"
    found = gguf_type(gf, key)
    if found is not None:
        if found != "ARRAY of STRING":
            raise ModelFileError(f"'{gf.name}': '{key}' has GGUF type {found}, expected ARRAY of STRING")
        fld = gf.get_field(key)
        data = getattr(fld, "data", None)
        n = len(data) if isinstance(data, list) else len(gf.get(key))
        if not 1 <= n <= INT32_MAX:
            raise ModelFileError(f"'{gf.name}': '{key}' has {n} tokens, the vocabulary needs 1..{INT32_MAX}")
        return n
    ne = gf.tensor("token_embd.weight").ne if "token_embd.weight" in gf else ()
    if len(ne) < 2 or ne[1] < 1:
        raise ModelFileError(f"'{gf.name}': n_vocab is unknown: '{key}' is missing and tensor 'token_embd.weight' "
                             + (f"has ne={list(ne)}" if "token_embd.weight" in gf else "is missing"))
    return int(ne[1])


def _swa_layers(gf: GGUFFile, key: str, n_layer: int, default_pattern: int) -> tuple[bool, ...]:
    """Which layers slide, from a per-layer array or a pattern n (llama.cpp's load_swa_pattern, set_swa_pattern)."""
    found = gguf_type(gf, key)
    if found is not None and found.startswith("ARRAY"):
        flags = [bool(x) for x in gf.get(key)]
        if len(flags) != n_layer:
            raise ModelFileError(f"'{gf.name}': '{key}' has {len(flags)} entries, block_count is {n_layer}")
        return tuple(flags)
    n = read_int(gf, key, default_pattern, minimum=0)
    return tuple(n == 0 or il % n < n - 1 for il in range(n_layer))


MAX_EXPERTS = 512  # llama.cpp's LLAMA_MAX_EXPERTS


def _experts(gf: GGUFFile, arch: Arch, n_ff: int) -> tuple[int, int, int]:
    """(n_expert, n_expert_used, n_ff_exp), checked as llama.cpp's load_hparams asserts them."""
    p = f"{arch.name}."
    n_expert = read_int(gf, p + "expert_count", 0, minimum=0, maximum=MAX_EXPERTS)
    n_used = read_int(gf, p + "expert_used_count", 0, minimum=0, maximum=MAX_EXPERTS)
    if arch.experts and not n_expert:
        found = "missing" if gguf_type(gf, p + "expert_count") is None else "0"
        raise ModelFileError(f"'{gf.name}': '{p}expert_count' is {found}; {arch.name} needs experts")
    if n_used > n_expert or (n_expert and not n_used):
        raise ModelFileError(f"'{gf.name}': '{p}expert_used_count' = {n_used} must be in 1..'{p}expert_count' = "
                             f"{n_expert}" if n_expert else f"'{gf.name}': '{p}expert_used_count' = {n_used} "
                             f"without experts ('{p}expert_count' is 0)")
    groups = read_int(gf, p + "expert_group_count", 0, minimum=0)
    if groups > 1:
        raise ModelFileError(f"'{gf.name}': '{p}expert_group_count' = {groups}: pyggml does not select experts by "
                             f"groups (DeepSeek V3's routing)")
    if not n_expert:
        return 0, 0, 0
    # qwen3moe's files without the key: the FFN's width shared among the experts used (llama.cpp's loader)
    n_ff_exp = read_int(gf, p + "expert_feed_forward_length", n_ff // n_used if arch.experts else n_ff)
    return n_expert, n_used, n_ff_exp


def _family_scales(gf: GGUFFile, arch: Arch, n_layer: int) -> dict[str, Any]:
    """HParams fields: the layers that rope (smollm3's, granite's by rope.scaling.finetuned), granite's scales."""
    p = f"{arch.name}."
    out: dict[str, Any] = {}
    if arch.no_rope_layer_step:
        out["rope_layers"] = tuple((il + 1) % arch.no_rope_layer_step != 0 for il in range(n_layer))
    if arch.granite_scales:
        out["rope_layers"] = (read_bool(gf, p + "rope.scaling.finetuned", True),) * n_layer
        # granitehybrid's keys are optional (llama.cpp's loader), granite's logit scale is not
        out["f_logit_scale"] = read_float(gf, p + "logit_scale", *((0.0, True) if arch.recurrent else ()))
        out["f_residual_scale"] = read_float(gf, p + "residual_scale", 0.0, allow_zero=True)
        out["f_embedding_scale"] = read_float(gf, p + "embedding_scale", 0.0, allow_zero=True)
        out["f_attention_scale"] = read_float(gf, p + "attention.scale", 0.0, allow_zero=True)
        out["n_ff_shexp"] = read_int(gf, p + "expert_shared_feed_forward_length", 0, minimum=0)
    return out


def _head_count_kv(gf: GGUFFile, arch: Arch, n_layer: int, n_head: int) -> tuple[int, tuple[bool, ...]]:
    """(n_head_kv, the recurrent layers: 0 in a per-layer array); the KV cache takes one width for the others."""
    key = f"{arch.name}.attention.head_count_kv"
    found = gguf_type(gf, key)
    if found is None or not found.startswith("ARRAY"):
        return read_int(gf, key, n_head), ()
    counts = [int(x) for x in gf.get(key)]
    if len(counts) != n_layer:
        raise ModelFileError(f"'{gf.name}': '{key}' has {len(counts)} entries, block_count is {n_layer}")
    if not arch.recurrent and 0 in counts:
        raise ModelFileError(f"'{gf.name}': '{key}' = {counts} has layers of 0 KV heads; {arch.name} has no "
                             f"recurrent layers")
    widths = sorted({n for n in counts if n})
    if len(widths) > 1 or any(n < 0 for n in counts):
        raise ModelFileError(f"'{gf.name}': '{key}' = {counts}: pyggml's attention layers need one KV head count "
                             f"(and recurrent layers 0)")
    return (widths[0] if widths else n_head), tuple(n == 0 for n in counts) if arch.recurrent else ()


def _recurrent(gf: GGUFFile, arch: Arch) -> dict[str, int]:
    """HParams fields of the recurrent blocks: lfm2's conv window, Mamba-2's sizes (llama.cpp's ssm_* keys)."""
    p = f"{arch.name}."
    if arch.recurrent == RECURRENT_SHORTCONV:
        if read_int(gf, p + "attention.sliding_window", 0, minimum=0) or not read_bool(gf, p + "attention.causal",
                                                                                      True):
            raise ModelFileError(f"'{gf.name}': '{p}attention.sliding_window' or '{p}attention.causal' = false: "
                                 f"pyggml's lfm2 has causal global attention only (llama.cpp's other lfm2 graphs)")
        return {"n_shortconv_l_cache": read_int(gf, p + "shortconv.l_cache", minimum=2)}
    if arch.recurrent == RECURRENT_MAMBA2:
        out = {"ssm_d_conv": read_int(gf, p + "ssm.conv_kernel"), "ssm_d_inner": read_int(gf, p + "ssm.inner_size"),
               "ssm_d_state": read_int(gf, p + "ssm.state_size"),
               "ssm_dt_rank": read_int(gf, p + "ssm.time_step_rank"),
               "ssm_n_group": read_int(gf, p + "ssm.group_count")}
        for what, n in (("ssm.time_step_rank", out["ssm_dt_rank"]), ("ssm.group_count", out["ssm_n_group"])):
            if out["ssm_d_inner"] % n:
                raise ModelFileError(f"'{gf.name}': '{p}ssm.inner_size' = {out['ssm_d_inner']} is not a multiple "
                                     f"of '{p}{what}' = {n}")
        if out["ssm_dt_rank"] % out["ssm_n_group"]:
            raise ModelFileError(f"'{gf.name}': '{p}ssm.time_step_rank' = {out['ssm_dt_rank']} heads are not a "
                                 f"multiple of '{p}ssm.group_count' = {out['ssm_n_group']}")
        return out
    return {}


@dataclass(frozen=True)
class HParams:
    """llama.cpp's `llama_hparams` for the families of `ARCHS`."""

    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_rot: int
    f_norm_rms_eps: float
    rope_freq_base: float
    rope_freq_scale: float
    arch: Arch = ARCHS["llama"]
    n_embd_head: int = 0  # attention.key_length; 0: n_embd / n_head
    n_ctx_orig_yarn: int = 0  # rope.scaling.original_context_length; 0: n_ctx_train
    rope_ext_factor: float = 0.0
    rope_attn_factor: float = 1.0
    rope_freq_base_swa: float = 10000.0
    rope_freq_scale_swa: float = 1.0
    n_swa: int = 0
    swa_layers: tuple[bool, ...] = field(default=())
    f_attention_scale: float = 0.0  # 0: 1/sqrt(head_dim)
    f_final_logit_softcapping: float = 0.0
    f_attn_logit_softcapping: float = 0.0
    f_embedding_scale: float = 0.0
    f_residual_scale: float = 0.0
    f_logit_scale: float = 0.0  # the logits divided by it (0: none)
    rope_layers: tuple[bool, ...] = field(default=())  # which layers rope Q and K (empty: every layer)
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0
    recurrent_layers: tuple[bool, ...] = field(default=())  # llama.cpp's is_recr (empty: none)
    n_shortconv_l_cache: int = 0
    ssm_d_conv: int = 0
    ssm_d_inner: int = 0
    ssm_d_state: int = 0
    ssm_dt_rank: int = 0  # Mamba-2's heads
    ssm_n_group: int = 0

    def is_recurrent(self, il: int) -> bool:
        return bool(self.recurrent_layers) and self.recurrent_layers[il]

    @property
    def any_recurrent(self) -> bool:
        return any(self.recurrent_layers)

    @property
    def any_attention(self) -> bool:
        return not all(self.recurrent_layers or (False,))

    @property
    def any_rope(self) -> bool:
        return any(self.has_rope(il) and not self.is_recurrent(il) for il in range(self.n_layer))

    @property
    def n_embd_r(self) -> int:
        """A sequence's conv state per layer (llama.cpp's n_embd_r): the last l_cache - 1 or d_conv - 1 inputs."""
        if self.n_shortconv_l_cache:
            return self.n_embd * (self.n_shortconv_l_cache - 1)
        return max(self.ssm_d_conv - 1, 0) * (self.ssm_d_inner + 2 * self.ssm_n_group * self.ssm_d_state)

    @property
    def n_embd_s(self) -> int:
        """A sequence's SSM state per layer (llama.cpp's n_embd_s): d_state x d_inner (0 without one)."""
        return self.ssm_d_state * self.ssm_d_inner

    @property
    def head_dim(self) -> int:
        return self.n_embd_head or self.n_embd // self.n_head

    @property
    def n_embd_q(self) -> int:
        return self.head_dim * self.n_head

    @property
    def n_embd_gqa(self) -> int:
        return self.head_dim * self.n_head_kv

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv

    @property
    def n_ctx_orig(self) -> int:
        return self.n_ctx_orig_yarn or self.n_ctx_train

    def has_rope(self, il: int) -> bool:
        return not self.rope_layers or self.rope_layers[il]

    def is_swa(self, il: int) -> bool:
        return self.n_swa > 0 and bool(self.swa_layers) and self.swa_layers[il]

    @property
    def any_swa(self) -> bool:
        return any(self.is_swa(il) for il in range(self.n_layer))

    def rope_base_scale(self, il: int) -> tuple[float, float]:
        if self.is_swa(il):
            return self.rope_freq_base_swa, self.rope_freq_scale_swa
        return self.rope_freq_base, self.rope_freq_scale

    @classmethod
    def from_gguf(cls, gf: GGUFFile) -> HParams:
        """The `<arch>.*` keys, each checked for type and range; ModelFileError naming the key and the value."""
        arch = arch_of(gf)
        p = f"{arch.name}."
        n_embd = read_int(gf, p + "embedding_length")
        n_layer = read_int(gf, p + "block_count")
        n_head = read_int(gf, p + "attention.head_count")
        n_head_kv, recurrent_layers = _head_count_kv(gf, arch, n_layer, n_head)
        head_dim = read_int(gf, p + "attention.key_length", 0, minimum=0)
        if not head_dim and n_embd % n_head:
            raise ModelFileError(f"'{gf.name}': '{p}embedding_length' = {n_embd} is not a multiple of "
                                 f"'{p}attention.head_count' = {n_head}")
        head_dim = head_dim or n_embd // n_head
        head_dim_v = read_int(gf, p + "attention.value_length", head_dim)
        if head_dim_v != head_dim:
            raise ModelFileError(f"'{gf.name}': '{p}attention.value_length' = {head_dim_v} differs from the key "
                                 f"length {head_dim}; pyggml's {arch.name} needs them equal, as llama.cpp's")
        if n_head % n_head_kv:
            raise ModelFileError(f"'{gf.name}': '{p}attention.head_count' = {n_head} is not a multiple of "
                                 f"'{p}attention.head_count_kv' = {n_head_kv}")
        n_rot = read_int(gf, p + "rope.dimension_count", head_dim)
        if n_rot > head_dim:
            raise ModelFileError(f"'{gf.name}': '{p}rope.dimension_count' = {n_rot} is more than the head size "
                                 f"{head_dim}")
        if n_rot % 2:
            raise ModelFileError(f"'{gf.name}': '{p}rope.dimension_count' = {n_rot} must be even (RoPE turns pairs)")
        scaling = read_str(gf, p + "rope.scaling.type", "linear")
        if scaling not in ("none", "linear", "yarn", "longrope"):
            raise ModelFileError(f"'{gf.name}': '{p}rope.scaling.type' = {scaling!r} is not supported "
                                 f"(supported: none, linear, yarn, longrope)")
        factor = read_float(gf, p + "rope.scaling.factor", 0.0, allow_zero=True) \
            or read_float(gf, p + "rope.scale_linear", 0.0, allow_zero=True)
        freq_scale = 1.0 if scaling == "none" or not factor else 1.0 / factor
        n_swa = read_int(gf, p + "attention.sliding_window", arch.n_swa_default, minimum=0) if arch.swa_pattern \
            else 0
        rope_base = read_float(gf, p + "rope.freq_base", 10000.0)
        n_ctx_train = read_int(gf, p + "context_length", 2048)
        n_ff = read_int(gf, p + "feed_forward_length")
        n_expert, n_expert_used, n_ff_exp = _experts(gf, arch, n_ff)
        hp = cls(
            n_vocab=_n_vocab(gf),
            n_ctx_train=n_ctx_train,
            n_embd=n_embd,
            n_layer=n_layer,
            n_ff=n_ff,
            n_head=n_head,
            n_head_kv=n_head_kv,
            n_rot=n_rot,
            f_norm_rms_eps=read_float(gf, p + "attention.layer_norm_rms_epsilon", 1e-5),
            rope_freq_base=rope_base,
            rope_freq_scale=freq_scale,
            arch=arch,
            n_embd_head=head_dim if head_dim * n_head != n_embd else 0,
            n_ctx_orig_yarn=read_int(gf, p + "rope.scaling.original_context_length", n_ctx_train),
            # YaRN: ext_factor 1; llama.cpp's attention factor mscale / (1 + 0.1 ln factor) is 1 here
            rope_ext_factor=1.0 if scaling == "yarn" else 0.0,
            rope_attn_factor=read_float(gf, p + "rope.scaling.attn_factor", 1.0),
            rope_freq_base_swa=read_float(gf, p + "rope.freq_base_swa",
                                          rope_base if arch.swa_rope_is_global else 10000.0),
            rope_freq_scale_swa=freq_scale if arch.swa_rope_is_global else 1.0,
            n_swa=n_swa,
            swa_layers=_swa_layers(gf, p + "attention.sliding_window_pattern", n_layer, arch.swa_pattern)
            if n_swa else (),
            f_final_logit_softcapping=read_float(gf, p + "final_logit_softcapping", 30.0 if arch.attn_softcap else 0.0,
                                                 allow_zero=True),
            n_expert=n_expert,
            n_expert_used=n_expert_used,
            n_ff_exp=n_ff_exp,
            f_attn_logit_softcapping=read_float(gf, p + "attn_logit_softcapping", 50.0) if arch.attn_softcap else 0.0,
            recurrent_layers=recurrent_layers,
            **_family_scales(gf, arch, n_layer),
            **_recurrent(gf, arch),
        )
        if arch.scale_q:  # llama.cpp: gemma3's f_attention_scale (its 27B by n_embd / n_head), phi3's head size
            by_embd = arch.q_scale_by_embd_layers and n_layer == arch.q_scale_by_embd_layers
            hp = replace(hp, f_attention_scale=1.0 / math.sqrt(n_embd // n_head if by_embd else head_dim))
        return hp


Shapes = dict[str, tuple[tuple[int, ...], str, bool]]  # name -> (ne, what it is made of, required)


def expected_shapes(hp: HParams, gf: GGUFFile | None = None) -> Shapes:
    """The `ne` of each tensor a file of `hp` holds and whether llama.cpp's loader requires it (the head is
    optional, tied to token_embd); with `gf`, a fused `attn_qkv` replaces Q, K and V."""
    a = hp.arch
    e, f, v = hp.n_embd, hp.n_ff, hp.n_vocab
    out: Shapes = {
        "token_embd.weight": ((e, v), "n_embd, n_vocab", True), a.output_norm + ".weight": ((e,), "n_embd", True),
        "output.weight": ((e, v), "n_embd, n_vocab", False), "output.bias": ((v,), "n_vocab", False)}
    for name in ("rope_freqs", "rope_factors_long", "rope_factors_short"):
        out[f"{name}.weight"] = ((hp.n_rot // 2,), "n_rot / 2", False)
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        if a.pre_norms:
            out[b + "attn_norm.weight"] = ((e,), "n_embd", True)
        if hp.is_recurrent(il):
            out.update(_recurrent_shapes(hp, b))
        else:
            out.update(_attention_shapes(hp, b, gf))
        if a.pre_norms:
            out[b + a.ffn_norm + ".weight"] = ((e,), "n_embd", True)
        if hp.n_expert:
            out.update(_expert_shapes(hp, b, gf))
        elif a.ffn == FFN_SWIGLU_FUSED:
            out.update(_linear(b + "ffn_up", e, 2 * f, "n_embd, 2 n_ff"))
            out.update(_linear(b + "ffn_down", f, e, "n_ff, n_embd"))
        else:
            out.update(_linear(b + "ffn_gate", e, f, "n_embd, n_ff"))
            out.update(_linear(b + "ffn_down", f, e, "n_ff, n_embd"))
            out.update(_linear(b + "ffn_up", e, f, "n_embd, n_ff"))
    return out


def _linear(name: str, n_in: int, n_out: int, made_of: str, bias: bool = False, required: bool = True) -> Shapes:
    return {name + ".weight": ((n_in, n_out), made_of, required),
            name + ".bias": ((n_out,), made_of.split(", ")[-1], bias and required)}


def _attention_shapes(hp: HParams, b: str, gf: GGUFFile | None) -> Shapes:
    """An attention layer's Q, K, V (or fused QKV), output, sinks, Q/K norms and post-norms."""
    a, e, q, kv, hd = hp.arch, hp.n_embd, hp.n_embd_q, hp.n_embd_gqa, hp.head_dim
    out: Shapes = {}
    fused = gf is not None and b + "attn_qkv.weight" in gf
    out.update(_linear(b + "attn_qkv", e, q + 2 * kv, "n_embd, n_embd_q + 2 n_embd_gqa", required=fused))
    out.update(_linear(b + "attn_q", e, q, "n_embd, n_embd_q", a.qkv_bias, not fused))
    out.update(_linear(b + "attn_k", e, kv, "n_embd, n_embd_gqa", a.qkv_bias, not fused))
    out.update(_linear(b + "attn_v", e, kv, "n_embd, n_embd_gqa", a.qkv_bias, not fused))
    out.update(_linear(b + "attn_output", q, e, "n_embd_q, n_embd"))
    if a.attn_sinks:
        out[b + "attn_sinks.weight"] = ((hp.n_head,), "n_head", True)
    if a.qk_norm == QK_NORM_HEAD:
        out[b + "attn_q_norm.weight"] = ((hd,), "head_dim", True)
        out[b + "attn_k_norm.weight"] = ((hd,), "head_dim", True)
    elif a.qk_norm == QK_NORM_ALL:
        out[b + "attn_q_norm.weight"] = ((q,), "n_embd_q", True)
        out[b + "attn_k_norm.weight"] = ((kv,), "n_embd_gqa", True)
    if a.post_norms:
        out[b + "post_attention_norm.weight"] = ((e,), "n_embd", True)
        out[b + "post_ffw_norm.weight"] = ((e,), "n_embd", True)
    return out


def _recurrent_shapes(hp: HParams, b: str) -> Shapes:
    """A recurrent layer's block: lfm2's short convolution, or Mamba-2's (llama.cpp's load_arch_tensors)."""
    e = hp.n_embd
    if hp.arch.recurrent == RECURRENT_SHORTCONV:
        return {b + "shortconv.conv.weight": ((hp.n_shortconv_l_cache, e), "l_cache, n_embd", True),
                b + "shortconv.in_proj.weight": ((e, 3 * e), "n_embd, 3 n_embd", True),
                b + "shortconv.out_proj.weight": ((e, e), "n_embd, n_embd", True)}
    d_inner, n_head, n_group = hp.ssm_d_inner, hp.ssm_dt_rank, hp.ssm_n_group
    d_xbc = d_inner + 2 * n_group * hp.ssm_d_state
    return {b + "ssm_in.weight": ((e, d_inner + d_xbc + n_head), "n_embd, 2 d_inner + 2 n_group d_state + n_head",
                                  True),
            b + "ssm_conv1d.weight": ((hp.ssm_d_conv, d_xbc), "d_conv, d_inner + 2 n_group d_state", True),
            b + "ssm_conv1d.bias": ((d_xbc,), "d_inner + 2 n_group d_state", False),
            b + "ssm_dt.bias": ((n_head,), "n_head", True),
            b + "ssm_a": ((1, n_head), "1, n_head", True),
            b + "ssm_d": ((1, n_head), "1, n_head", True),
            b + "ssm_norm.weight": ((d_inner // n_group, n_group), "d_inner / n_group, n_group", True),
            b + "ssm_out.weight": ((d_inner, e), "d_inner, n_embd", True)}


def _expert_shapes(hp: HParams, b: str, gf: GGUFFile | None) -> Shapes:
    """A layer's router and experts' gate, up (or fused gate_up) and down, biases optional (build_moe_ffn)."""
    e, f, n = hp.n_embd, hp.n_ff_exp, hp.n_expert
    fused = gf is not None and b + "ffn_gate_up_exps.weight" in gf
    out: Shapes = {b + "ffn_gate_inp.weight": ((e, n), "n_embd, n_expert", True),
                   b + "ffn_gate_inp.bias": ((n,), "n_expert", False)}
    for name, rows, made_of, required in (("ffn_gate_up_exps", 2 * f, "2 n_ff_exp", fused),
                                          ("ffn_gate_exps", f, "n_ff_exp", not fused),
                                          ("ffn_up_exps", f, "n_ff_exp", not fused)):
        out[b + name + ".weight"] = ((e, rows, n), f"n_embd, {made_of}, n_expert", required)
        out[b + name + ".bias"] = ((rows, n), f"{made_of}, n_expert", False)
    out[b + "ffn_down_exps.weight"] = ((f, e, n), "n_ff_exp, n_embd, n_expert", True)
    out[b + "ffn_down_exps.bias"] = ((e, n), "n_embd, n_expert", False)
    if hp.n_ff_shexp:
        s = hp.n_ff_shexp
        out[b + "ffn_gate_shexp.weight"] = ((e, s), "n_embd, n_ff_shexp", True)
        out[b + "ffn_up_shexp.weight"] = ((e, s), "n_embd, n_ff_shexp", True)
        out[b + "ffn_down_shexp.weight"] = ((s, e), "n_ff_shexp, n_embd", True)
    return out


def check_tensors(hp: HParams, gf: GGUFFile) -> list[str]:
    """The tensors to load, each checked for shape and type before any memory is taken (ModelFileError)."""
    names = []
    for name, (want, made_of, required) in expected_shapes(hp, gf).items():
        if name not in gf:
            if required:
                raise ModelFileError(f"'{gf.name}': tensor '{name}' is missing (the hyper-parameters want ne="
                                     f"{list(want)}, [{made_of}]; {len(list(gf))} tensors in the file)")
            continue
        info = gf.tensor(name)
        ne = tuple(info.ne)
        pad = max(len(ne), len(want))
        if ne + (1,) * (pad - len(ne)) != want + (1,) * (pad - len(want)):
            raise ModelFileError(f"'{gf.name}': tensor '{name}' has ne={list(ne)}, the hyper-parameters want "
                                 f"{list(want)} ([{made_of}])")
        if info.type not in WEIGHT_TYPES:
            raise ModelFileError(f"'{gf.name}': tensor '{name}' has type {info.type.name}, which pyggml does not "
                                 f"compute in models (supported: {', '.join(t.name for t in WEIGHT_TYPES)})")
        names.append(name)
    return names


def tensor_names(hp: HParams, gf: GGUFFile | None = None) -> list[str]:
    if gf is not None:
        return [n for n, (_, _, required) in expected_shapes(hp, gf).items() if required or n in gf]
    return [n for n, (_, _, required) in expected_shapes(hp).items() if required or n == "output.weight"]


def layer_of(name: str) -> int | None:
    if name.startswith("blk."):
        return int(name.split(".")[1])
    return None
