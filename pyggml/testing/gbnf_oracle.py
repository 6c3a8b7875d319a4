"""llama.cpp's own GBNF engine as an oracle: does a grammar accept a text, as llama.cpp's grammar sampler decides.

    results = gbnf_accepts(model_path, grammar_text, ["1. e4 e5\\n2. Nf3 Nc6\\n"])
    # [Acceptance(tokens=8, accepted=8, complete=True)]

Each text is tokenized with llama.cpp's tokenizer of the model file (its vocabulary only), then its tokens go one
by one through `llama_sampler_init_grammar` (the sampler `--grammar` builds): a token is accepted when the sampler
leaves its logit finite; the text is complete when, after all of them, the end-of-generation token is allowed too.
The sdist's ctypes bindings run over the libllama.so that pyggml.testing.llamacpp builds, in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from pyggml.testing import llamacpp

_ACCEPTS = llamacpp.BINDINGS_PRELUDE + r"""
model_path, grammar, texts = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
mp = ll.llama_model_default_params()
mp.vocab_only = True
model = ll.llama_model_load_from_file(model_path.encode(), mp)
assert model, f"llama.cpp did not load {model_path}"
vocab = ll.llama_model_get_vocab(model)
eog = [t for t in (ll.llama_vocab_eos(vocab), ll.llama_vocab_eot(vocab)) if t >= 0]

def allowed(smpl, token):
    data = ll.llama_token_data(token, 0.0, 0.0)
    arr = ll.llama_token_data_array(ctypes.pointer(data), 1, -1, False)
    ll.llama_sampler_apply(smpl, ctypes.byref(arr))
    return data.logit != float("-inf")

out = []
for text in texts:
    smpl = ll.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    assert smpl, "llama.cpp did not parse the grammar"
    raw = text.encode()
    buf = (ll.llama_token * (len(raw) + 8))()
    n = ll.llama_tokenize(vocab, raw, len(raw), buf, len(buf), False, False)
    assert n >= 0, f"llama_tokenize returned {n}"
    ok = 0
    for t in buf[:n]:
        if not allowed(smpl, t):
            break
        ll.llama_sampler_accept(smpl, t)
        ok += 1
    out.append([n, ok, ok == n and any(allowed(smpl, t) for t in eog)])
    ll.llama_sampler_free(smpl)
ll.llama_model_free(model)
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Acceptance:
    """A text's tokens, how many of them the grammar accepted in a row, and whether it may end there."""

    tokens: int
    accepted: int
    complete: bool

    @property
    def prefix(self) -> bool:
        """Every token accepted: the text is the start of a sentence of the grammar (or a whole one)."""
        return self.accepted == self.tokens


def gbnf_accepts(model_path: Path, grammar: str, texts: list[str]) -> list[Acceptance]:
    """How llama.cpp's grammar sampler takes each of `texts` under `grammar` (GBNF, root rule `root`) with the
    vocabulary of `model_path`; builds llama.cpp if this machine lacks it (NoCompilerError without a compiler)."""
    lib_dir = llamacpp.require_tools(["llama-debug"])["llama-debug"].parent  # libllama.so is built beside it
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(lib_dir)}
    r = subprocess.run([sys.executable, "-c", _ACCEPTS, str(llamacpp.paths().sdist), str(model_path), grammar,
                        json.dumps(texts)], capture_output=True, text=True, timeout=300, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"llama.cpp's grammar check failed (exit {r.returncode}):\n{r.stderr[-4000:]}")
    return [Acceptance(*row) for row in json.loads(r.stdout.strip().splitlines()[-1])]


__all__ = ["Acceptance", "gbnf_accepts"]
