"""LLaMA prompt and generation speed: pyggml (F32, F16, Q8_0, Q4_0 files) beside HF transformers.

A ~125M-parameter LLaMA (hidden 768, 12 layers, 12 heads, 4 KV heads, FFN
2048, vocab 32000) with random weights (fixed seed) is made with
transformers, written to GGUF in each type, and run by both with the same
thread count (2 by default):

- prompt: tokens/s of evaluating a 128-token prompt from an empty cache
  (logits of the last token, as llama-bench's pp test);
- generation: tokens/s of decoding 32 tokens one at a time with the KV
  cache (as llama-bench's tg test).

Medians over `--reps` runs after one warm-up. The ratio column is pyggml's
speed over transformers' (> 1: pyggml is faster).

    python benchmarks/bench_llama.py [--threads 2] [--reps 3] [--types f32,f16,q8_0,q4_0] [--small]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
from timing import median_time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--types", default="f32,f16,q8_0,q4_0")
    ap.add_argument("--small", action="store_true", help="a 2-layer model of hidden 256 (a quick check)")
    args = ap.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    import pyggml.models as pm
    from pyggml.models.convert import write_llama_gguf

    torch.set_num_threads(args.threads)
    dims = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                intermediate_size=2048, vocab_size=32000)
    if args.small:
        dims = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                    intermediate_size=512, vocab_size=32000)
    torch.manual_seed(0)
    cfg = LlamaConfig(**dims, max_position_embeddings=2048, tie_word_embeddings=False,
                      attn_implementation="sdpa")
    hf = LlamaForCausalLM(cfg).eval()
    n_params = sum(p.numel() for p in hf.parameters())
    state = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, dims["vocab_size"], args.prompt).tolist()
    n_ctx = args.prompt + args.gen + 16
    print(f"LLaMA {n_params / 1e6:.0f}M parameters ({dims}), {args.threads} threads, "
          f"prompt {args.prompt} tokens, generation {args.gen} tokens, median of {args.reps}")

    # --- transformers ---
    def hf_prompt() -> None:
        with torch.inference_mode():
            hf(torch.tensor([prompt]), use_cache=False, logits_to_keep=1)

    def hf_gen() -> None:
        with torch.inference_mode():
            past = None
            tok = torch.tensor([[prompt[0]]])
            for _ in range(args.gen):
                out = hf(tok, past_key_values=past, use_cache=True)
                past = out.past_key_values
                tok = out.logits[:, -1:].argmax(-1)

    hf_pp = args.prompt / median_time(hf_prompt, args.reps)
    hf_tg = args.gen / median_time(hf_gen, args.reps)
    rows = [("transformers f32", hf_pp, hf_tg)]

    with tempfile.TemporaryDirectory() as tmp:
        for ty in args.types.split(","):
            path = os.path.join(tmp, f"llama-{ty}.gguf")
            t0 = time.perf_counter()
            write_llama_gguf(path, cfg.to_dict(), state, type=ty.upper())
            t_write = time.perf_counter() - t0
            t0 = time.perf_counter()
            model = pm.load(path, n_ctx=n_ctx, n_threads=args.threads, progress=False)
            t_load = time.perf_counter() - t0

            def pp(model: pm.Model = model) -> None:
                model.reset()
                model.eval_last(prompt)

            def tg(model: pm.Model = model) -> None:
                model.reset()
                tok = prompt[0]
                for _ in range(args.gen):
                    tok = int(np.argmax(model.eval_last([tok])))

            pp_s = args.prompt / median_time(pp, args.reps)
            rows.append((f"pyggml {ty}", pp_s, args.gen / median_time(tg, args.reps)))
            print(f"  {ty}: written in {t_write:.1f} s, loaded in {t_load:.2f} s, "
                  f"{os.path.getsize(path) / 2**20:.0f} MiB", flush=True)
            model.free()
            os.remove(path)

    print()
    print(f"{'':<18}{'prompt t/s':>12}{'ratio':>8}{'gen t/s':>12}{'ratio':>8}")
    for name, pp_s, tg_s in rows:
        print(f"{name:<18}{pp_s:>12.1f}{pp_s / hf_pp:>8.2f}{tg_s:>12.1f}{tg_s / hf_tg:>8.2f}")


if __name__ == "__main__":
    main()
