#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "engine/local_sequence.h"
#include "model/model.h"

namespace kvs {

double token_nll(const float* logits, int n_vocab, int target) {
  double mx = logits[0];
  for (int i = 1; i < n_vocab; ++i) mx = logits[i] > mx ? logits[i] : mx;
  double sum = 0;
  for (int i = 0; i < n_vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  return -(double(logits[target]) - mx - std::log(sum));
}

void for_each_scored_piece(int ctx, const std::function<void(int p0, int n)>& piece) {
  for (int p0 = ctx / 2; p0 < ctx; p0 += LocalSequence::kDefaultChunk)
    piece(p0, std::min(LocalSequence::kDefaultChunk, ctx - p0));
}

PerplexityResult perplexity(Engine& e, const std::vector<int>& tokens, int ctx, int bos,
                            const std::function<void(int, int, double)>& progress, const KvCacheOptions& cache,
                            int block_size) {
  if (ctx < 4) throw std::invalid_argument("perplexity: context must be >= 4");
  PerplexityResult r;
  r.n_chunks = int(tokens.size() / ctx);
  if (r.n_chunks == 0)
    throw std::invalid_argument("perplexity: text has " + std::to_string(tokens.size()) +
                                " tokens, fewer than one context of " + std::to_string(ctx));
  const int nv = e.model().config().n_vocab;
  LocalSequence seq(e, ctx, block_size, cache);
  const int first = ctx / 2;
  double nll = 0;
  std::vector<int32_t> chunk(ctx);
  for (int c = 0; c < r.n_chunks; ++c) {
    for (int i = 0; i < ctx; ++i) chunk[i] = tokens[size_t(c) * ctx + i];
    if (bos >= 0) chunk[0] = bos;
    seq.reset();
    seq.eval(chunk.data(), first);  // the context half: not scored
    for_each_scored_piece(ctx, [&](int p0, int n) {
      const std::vector<float>& lg = seq.eval(&chunk[size_t(p0)], n, /*all_logits=*/true);  // [n, n_vocab]
      for (int j = p0; j < std::min(p0 + n, ctx - 1); ++j) {
        nll += token_nll(&lg[size_t(j - p0) * nv], nv, tokens[size_t(c) * ctx + j + 1]);
        ++r.n_scored;
      }
    });
    r.chunk_ppl.push_back(std::exp(nll / r.n_scored));
    if (progress) progress(c + 1, r.n_chunks, r.chunk_ppl.back());
  }
  r.nll = nll / r.n_scored;
  r.ppl = std::exp(r.nll);
  return r;
}

}  // namespace kvs
