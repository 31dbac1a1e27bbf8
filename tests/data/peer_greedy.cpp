// Not built with kvserve: the measuring stick behind tests/data/moe_golden.json.
// Built against a peer's library, e.g. for llama.cpp b4748:
//   g++ -O2 -std=c++17 -I $LLAMA/include -I $LLAMA/ggml/include peer_greedy.cpp \
//       -L $LLAMA/build/bin -lllama -lggml -lggml-base -Wl,-rpath,$LLAMA/build/bin -o peer_greedy
// (ik_llama.cpp: add -DIK_LLAMA for its older tokenize / batch calls.)
// Greedy continuation with a peer (llama.cpp b4748, or ik_llama.cpp with
// -DIK_LLAMA), one token at a time through the KV cache, printing JSON:
// the prompt's token ids, the greedy ids and the top-2 logit margin at each
// step. Usage: peer_greedy MODEL N_PREDICT KV(f16|f32) PROMPT...
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc < 5) return 1;
  const int n_predict = std::atoi(argv[2]);
  const bool f32 = std::strcmp(argv[3], "f32") == 0;
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return 2;
  const llama_vocab* vocab = llama_model_get_vocab(model);
#ifdef IK_LLAMA
  const int n_vocab = llama_n_vocab(model);
#else
  const int n_vocab = llama_vocab_n_tokens(vocab);
#endif
  std::printf("[\n");
  for (int a = 4; a < argc; ++a) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = 256;
    cp.n_threads = cp.n_threads_batch = 2;
    if (f32) cp.type_k = cp.type_v = GGML_TYPE_F32;
    llama_context* ctx = llama_init_from_model(model, cp);
    const std::string text = argv[a];
    std::vector<llama_token> toks(text.size() + 8);
#ifdef IK_LLAMA
    const int n = llama_tokenize(model, text.c_str(), int(text.size()), toks.data(), int(toks.size()), true, false);
#else
    const int n = llama_tokenize(vocab, text.c_str(), int(text.size()), toks.data(), int(toks.size()), true, false);
#endif
    toks.resize(n);
    std::printf("  {\"prompt\": \"%s\", \"prompt_tokens\": [", text.c_str());
    for (int i = 0; i < n; ++i) std::printf("%s%d", i ? ", " : "", toks[i]);
    std::printf("],\n   \"generated\": [");
    std::vector<int> gen;
    std::vector<double> margin;
    std::vector<llama_token> step = toks;
    int pos = 0;
    for (int s = 0; s < n_predict; ++s) {
#ifdef IK_LLAMA
      llama_batch b = llama_batch_get_one(step.data(), int(step.size()), pos, 0);
#else
      llama_batch b = llama_batch_get_one(step.data(), int(step.size()));
#endif
      if (llama_decode(ctx, b) != 0) return 3;
      pos += int(step.size());
      const float* lg = llama_get_logits_ith(ctx, -1);
      int best = 0, second = -1;
      for (int v = 1; v < n_vocab; ++v) {
        if (lg[v] > lg[best]) {
          second = best;
          best = v;
        } else if (second < 0 || lg[v] > lg[second]) {
          second = v;
        }
      }
      gen.push_back(best);
      margin.push_back(double(lg[best]) - double(lg[second]));
      step.assign(1, best);
    }
    for (size_t i = 0; i < gen.size(); ++i) std::printf("%s%d", i ? ", " : "", gen[i]);
    std::printf("],\n   \"top2_margin\": [");
    for (size_t i = 0; i < margin.size(); ++i) std::printf("%s%.5f", i ? ", " : "", margin[i]);
    std::printf("]}%s\n", a + 1 < argc ? "," : "");
    llama_free(ctx);
  }
  std::printf("]\n");
#ifdef IK_LLAMA
  llama_free_model(model);
#else
  llama_model_free(model);
#endif
  return 0;
}
