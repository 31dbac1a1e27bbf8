// Perplexity with llama.cpp's protocol (so numbers compare with
// llama-perplexity): tokenize the whole text once; cut it into
// floor(n_tokens / ctx) chunks; in each chunk the first token is replaced by
// BOS (when the model adds one); score tokens ctx/2+1 .. ctx-1 from the
// logits at positions ctx/2 .. ctx-2.
#pragma once
#include <functional>
#include <vector>
#include "engine/kv_cache.h"
#include "kvserve/engine.h"

namespace kvs {

struct PerplexityResult {
  double ppl = 0;
  double nll = 0;          // mean negative log-likelihood (nats)
  int n_chunks = 0;
  int64_t n_scored = 0;
  std::vector<double> chunk_ppl;  // running PPL after each chunk
};

// progress(done_chunks, total_chunks, running_ppl)
PerplexityResult perplexity(Engine& e, const std::vector<int>& tokens, int ctx, int bos,
                            const std::function<void(int, int, double)>& progress = nullptr,
                            const KvCacheOptions& cache = {}, int block_size = 16);

// The scored part of one chunk, a piece at a time: calls piece(p0, n) for
// consecutive pieces of at most LocalSequence::kDefaultChunk positions that
// cover [ctx / 2, ctx), after the caller fed positions [0, ctx / 2) without
// logits. Only a piece's logits are ever held ([n, n_vocab]), not the
// chunk's, and the unscored half gets none (no classifier rows for it).
void for_each_scored_piece(int ctx, const std::function<void(int p0, int n)>& piece);

// -log softmax(logits)[target], computed in double.
double token_nll(const float* logits, int n_vocab, int target);

}  // namespace kvs
