// Dumps every contiguous f32 tensor llama.cpp computes for one prompt (cb_eval), in graph order,
// for comparison with examples/dump_forward.rs (scripts/compare_dumps_gemma3.py; docs/REFERENCE.md).
// build: like scripts/llama-cpp-reference.sh builds llama_cpp_greedy.cpp, against the same static libs.
// usage: llama_dump MODEL ID,ID,... OUTDIR   (OUTDIR/index.txt: "<seq> <name> <op> ne0..ne3")
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

struct State { std::string dir; int seq = 0; FILE * index = nullptr; };

static bool cb(struct ggml_tensor * t, bool ask, void * ud) {
    State * s = (State *) ud;
    if (ask) return true;
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) return true;
    std::vector<float> buf(ggml_nelements(t));
    ggml_backend_tensor_get(t, buf.data(), 0, ggml_nbytes(t));
    char path[512];
    snprintf(path, sizeof path, "%s/%04d.bin", s->dir.c_str(), s->seq);
    FILE * f = fopen(path, "wb"); fwrite(buf.data(), 4, buf.size(), f); fclose(f);
    fprintf(s->index, "%04d %s %s %lld %lld %lld %lld\n", s->seq, t->name, ggml_op_desc(t), (long long) t->ne[0], (long long) t->ne[1], (long long) t->ne[2], (long long) t->ne[3]);
    s->seq++;
    return true;
}

int main(int argc, char ** argv) {
    std::vector<llama_token> prompt;
    std::stringstream ss(argv[2]); std::string item;
    while (std::getline(ss, item, ',')) prompt.push_back(std::atoi(item.c_str()));
    State st; st.dir = argv[3]; st.index = fopen((st.dir + "/index.txt").c_str(), "w");
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params(); mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = prompt.size() + 8; cp.n_batch = prompt.size(); cp.n_threads = 2; cp.n_threads_batch = 2;
    cp.cb_eval = cb; cp.cb_eval_user_data = &st;
    llama_context * ctx = llama_init_from_model(model, cp);
    llama_batch_ext * batch = llama_batch_ext_init(ctx);
    for (size_t i = 0; i < prompt.size(); ++i) {
        const int32_t idx = llama_batch_ext_add_token(batch, 0, prompt[i]);
        const llama_pos pos = i; llama_batch_ext_set_pos(batch, idx, &pos);
    }
    llama_batch_ext_set_output_logits(batch, prompt.size() - 1, true);
    if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch)) { fprintf(stderr, "decode failed\n"); return 1; }
    fclose(st.index);
    fprintf(stderr, "%d tensors\n", st.seq);
    return 0;
}
