// llama_probe: where do llama.cpp alone and llama.cpp through an RPC server (pyggml's) part ways?
//
// Greedy-decodes N tokens with llama.cpp (0c1e570's libllama), writes every step's logits to
// OUTDIR/logits.bin (float32, n_vocab per step) and, at step DUMPSTEP, every F32 node whose name matches
// FILTER to OUTDIR/<name>__<op>.bin through an eval callback (ggml_backend_tensor_get: also from an RPC
// device). Run it alone (RPC "-") and with "127.0.0.1:PORT" (every layer offloaded, as `-ngl 99`), then
// compare the files bit for bit, in the order they were written, to find the first op that differs.
// This is how pyggml's CPU numerics (pyggml/backends/cpu/numerics.py) were matched to llama.cpp's on
// SmolLM2: after the fixes, 64 greedy steps give llama.cpp's logits bit for bit, flash attention on and off.
//
// Build (the llama.cpp tree and build of `python -m pyggml.testing.llamacpp build`):
//   L=~/.cache/pyggml/llama.cpp/src/llama_cpp_python-0.3.36/vendor/llama.cpp B=~/.cache/pyggml/llama.cpp/build/bin
//   g++ -O1 -std=c++17 tools/llama_probe.cpp -I$L/include -I$L/ggml/include -L$B -lllama -lggml -lggml-base \
//       -Wl,-rpath,$B -o llama_probe
// Usage: llama_probe MODEL PROMPT N FA(0|1) RPC|- OUTDIR DUMPSTEP|-1 [FILTER regex, default all]
// (n_ctx 256, 2 threads, f16 KV cache: llama-completion's settings in tests/backends/rpc.)

#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <regex>

static int g_step = 0, g_dump_step = -1;
static std::string g_dir;
static std::regex g_filter(".*");

static bool cb(struct ggml_tensor * t, bool ask, void * ud) {
    if (g_step != g_dump_step) return false;
    if (!std::regex_match(std::string(t->name), g_filter)) return false;
    if (ask) return true;
    if (t->type != GGML_TYPE_F32) return true;
    size_t n = ggml_nbytes(t);
    std::vector<char> buf(n);
    ggml_backend_tensor_get(t, buf.data(), 0, n);
    std::string nm = t->name; for (auto & c : nm) if (c == '/' || c == ' ') c = '_';
    char path[1024]; snprintf(path, sizeof path, "%s/%s__%s.bin", g_dir.c_str(), nm.c_str(), ggml_op_desc(t));
    FILE * f = fopen(path, "wb"); fwrite(buf.data(), 1, n, f); fclose(f);
    return true;
}

int main(int argc, char ** argv) {
    // probe MODEL PROMPT N FA(0/1) RPC|- OUTDIR DUMPSTEP FILTER
    const char * model_path = argv[1]; std::string prompt = argv[2]; int n_predict = atoi(argv[3]);
    int fa = atoi(argv[4]); std::string rpc = argv[5]; g_dir = argv[6]; g_dump_step = atoi(argv[7]);
    if (argc > 8) g_filter = std::regex(argv[8]);
    ggml_backend_load_all();
    if (rpc != "-") {
        ggml_backend_reg_t rpc_reg = ggml_backend_reg_by_name("RPC");
        typedef ggml_backend_reg_t (*add_t)(const char *);
        auto fn = (add_t) ggml_backend_reg_get_proc_address(rpc_reg, "ggml_backend_rpc_add_server");
        ggml_backend_reg_t reg = fn(rpc.c_str());
        for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); i++) ggml_backend_device_register(ggml_backend_reg_dev_get(reg, i));
    }
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = rpc != "-" ? 99 : 0;
    llama_model * model = llama_model_load_from_file(model_path, mp);
    const llama_vocab * vocab = llama_model_get_vocab(model);
    int n_prompt = -llama_tokenize(vocab, prompt.c_str(), prompt.size(), NULL, 0, true, true);
    std::vector<llama_token> toks(n_prompt);
    llama_tokenize(vocab, prompt.c_str(), prompt.size(), toks.data(), toks.size(), true, true);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256; cp.n_threads = 2; cp.n_threads_batch = 2;
    cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.cb_eval = cb; cp.cb_eval_user_data = nullptr;
    llama_context * ctx = llama_init_from_model(model, cp);
    int n_vocab = llama_vocab_n_tokens(vocab);
    llama_batch batch = llama_batch_get_one(toks.data(), toks.size());
    llama_token tok;
    std::string lp = g_dir + "/logits.bin";
    FILE * lf = fopen(lp.c_str(), "wb");
    for (g_step = 0; g_step < n_predict; g_step++) {
        if (llama_decode(ctx, batch)) { fprintf(stderr, "decode failed\n"); return 1; }
        const float * logits = llama_get_logits_ith(ctx, -1);
        fwrite(logits, sizeof(float), n_vocab, lf);
        int best = 0; for (int i = 1; i < n_vocab; i++) if (logits[i] > logits[best]) best = i;
        tok = best;
        char piece[256]; int n = llama_token_to_piece(vocab, tok, piece, sizeof piece, 0, true);
        printf("%d\t%.*s\n", tok, n, piece); fflush(stdout);
        batch = llama_batch_get_one(&tok, 1);
    }
    fclose(lf);
    llama_free(ctx); llama_model_free(model);
    return 0;
}
