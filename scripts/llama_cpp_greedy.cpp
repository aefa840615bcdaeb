// Greedy generation from given prompt token ids with llama.cpp's library, printing token ids.
// llama-simple and llama-completion print text only; civetta's tests need ids, and feeding ids
// (not text) keeps tokenizer and chat-template questions out of the forward-pass comparison.
//
// usage: llama-cpp-greedy MODEL N_PREDICT ID,ID,... [N_THREADS] [LOGITS_OUT]
//   LOGITS_OUT: file that receives the logits at the last prompt position (n_vocab raw f32).
// stdout: {"tokens": [...], "runner_up": [...], "margins": [...], "rel_margins": [...]}
//   margin = top-1 minus top-2 logit at that step; rel_margin = margin / max |logit|.
// With LLAMA_CPP_GREEDY_PROMPT_LOGITS=1 in the environment the JSON also has "prompt_logits": all
// n_vocab logits of the prompt's last position (%.9g, f32 round trip).
// End-of-generation tokens do not stop it: exactly N_PREDICT tokens come out (like --ignore-eos).
// The prompt is decoded in one batch, then one token per step, as llama-simple does.
#include "llama.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

static void set_tokens(llama_batch_ext * batch, const llama_token * tokens, int32_t n, llama_pos pos_0) {
    llama_batch_ext_clear(batch);
    for (int32_t i = 0; i < n; ++i) {
        const int32_t idx = llama_batch_ext_add_token(batch, 0, tokens[i]);
        const llama_pos pos = pos_0 + i;
        llama_batch_ext_set_pos(batch, idx, &pos);
    }
    llama_batch_ext_set_output_logits(batch, n - 1, true);
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL N_PREDICT ID,ID,... [N_THREADS] [LOGITS_OUT]\n", argv[0]);
        return 2;
    }
    const char * model_path = argv[1];
    const int n_predict = std::atoi(argv[2]);
    std::vector<llama_token> prompt;
    {
        std::stringstream ss(argv[3]);
        std::string item;
        while (std::getline(ss, item, ',')) {
            prompt.push_back(std::atoi(item.c_str()));
        }
    }
    const int n_threads = argc > 4 ? std::atoi(argv[4]) : 2;
    const char * logits_out = argc > 5 ? argv[5] : nullptr;
    if (prompt.empty() || n_predict <= 0) {
        fprintf(stderr, "need a non-empty prompt and N_PREDICT > 0\n");
        return 2;
    }

    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(model_path, mparams);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", model_path);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = prompt.size() + n_predict;
    cparams.n_batch = prompt.size();
    cparams.n_threads = n_threads;
    cparams.n_threads_batch = n_threads;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (!ctx) {
        fprintf(stderr, "cannot create a context\n");
        return 1;
    }

    llama_batch_ext * batch = llama_batch_ext_init(ctx);
    set_tokens(batch, prompt.data(), prompt.size(), 0);
    int n_pos = 0;
    int n_in_batch = prompt.size();
    std::vector<llama_token> out, runner_up;
    std::vector<double> margins, rel_margins;
    const char * want_logits = std::getenv("LLAMA_CPP_GREEDY_PROMPT_LOGITS");
    std::vector<float> prompt_logits;
    for (int step = 0; step < n_predict; ++step) {
        if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch)) {
            fprintf(stderr, "decode failed at step %d\n", step);
            return 1;
        }
        n_pos += n_in_batch;
        const float * logits = llama_get_logits_ith(ctx, -1);
        if (step == 0 && want_logits && want_logits[0] == '1') {
            prompt_logits.assign(logits, logits + n_vocab);
        }
        if (step == 0 && logits_out) {
            FILE * f = std::fopen(logits_out, "wb");
            if (!f || std::fwrite(logits, sizeof(float), n_vocab, f) != (size_t) n_vocab || std::fclose(f)) {
                fprintf(stderr, "cannot write %s\n", logits_out);
                return 1;
            }
        }
        int best = 0, second = -1;
        float max_abs = 0.0f;
        for (int t = 0; t < n_vocab; ++t) {
            max_abs = std::fmax(max_abs, std::fabs(logits[t]));
            if (t == 0) continue;
            if (logits[t] > logits[best]) {
                second = best;
                best = t;
            } else if (second < 0 || logits[t] > logits[second]) {
                second = t;
            }
        }
        const double margin = (double) logits[best] - (double) logits[second];
        out.push_back(best);
        runner_up.push_back(second);
        margins.push_back(margin);
        rel_margins.push_back(max_abs > 0 ? margin / max_abs : 0.0);
        llama_token next = best;
        set_tokens(batch, &next, 1, n_pos);
        n_in_batch = 1;
    }

    auto print_ints = [](const char * key, const std::vector<llama_token> & v) {
        printf("\"%s\": [", key);
        for (size_t i = 0; i < v.size(); ++i) printf("%s%d", i ? ", " : "", v[i]);
        printf("]");
    };
    auto print_floats = [](const char * key, const std::vector<double> & v) {
        printf("\"%s\": [", key);
        for (size_t i = 0; i < v.size(); ++i) printf("%s%.6g", i ? ", " : "", v[i]);
        printf("]");
    };
    printf("{");
    print_ints("tokens", out);
    printf(", ");
    print_ints("runner_up", runner_up);
    printf(", ");
    print_floats("margins", margins);
    printf(", ");
    print_floats("rel_margins", rel_margins);
    if (!prompt_logits.empty()) {
        printf(", \"prompt_logits\": [");
        for (size_t i = 0; i < prompt_logits.size(); ++i) printf("%s%.9g", i ? ", " : "", prompt_logits[i]);
        printf("]");
    }
    printf("}\n");

    llama_batch_ext_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
