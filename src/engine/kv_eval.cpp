#include "engine/kv_eval.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "engine/local_sequence.h"
#include "engine/perplexity.h"
#include "model/model.h"

namespace kvs {

namespace {
// log-softmax of one logits row, in double: [n_vocab]
void log_softmax(const float* x, int n, std::vector<double>& out) {
  out.resize(size_t(n));
  double mx = x[0];
  for (int i = 1; i < n; ++i) mx = std::max(mx, double(x[i]));
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(double(x[i]) - mx);
  const double lse = mx + std::log(sum);
  for (int i = 0; i < n; ++i) out[size_t(i)] = double(x[i]) - lse;
}
int argmax(const float* x, int n) { return int(std::max_element(x, x + n) - x); }
}  // namespace

KvEvalResult kv_eval(Engine& e, const std::vector<int>& tokens, int ctx, int bos, const KvEvalOptions& o,
                     const std::function<void(int, int, double)>& progress) {
  if (ctx < 4) throw std::invalid_argument("eval: context must be >= 4");
  KvEvalResult r;
  r.n_chunks = int(tokens.size() / size_t(ctx));
  if (r.n_chunks == 0)
    throw std::invalid_argument("eval: text has " + std::to_string(tokens.size()) + " tokens, fewer than one context of " +
                                std::to_string(ctx));
  const int nv = e.model().config().n_vocab;
  Engine& re = o.reference ? *o.reference : e;
  if (re.model().config().n_vocab != nv) throw std::invalid_argument("eval: the reference model has another vocabulary");
  LocalSequence ref(re, ctx, o.block_size);
  LocalSequence pol(e, ctx, o.block_size, o.cache, o.window);
  r.kv_bytes_per_token = pol.layout().bytes_per_token_avg();
  const bool same =
      &re == &e && !pol.layout().quantized() && pol.layout().type == KvType::F32 && !pol.window().active();
  const int first = ctx / 2;
  double nll = 0, nll_ref = 0, kl = 0;
  int64_t agree = 0;
  std::vector<int32_t> chunk(size_t(ctx), 0);
  std::vector<double> lp, lq;
  for (int c = 0; c < r.n_chunks; ++c) {
    for (int i = 0; i < ctx; ++i) chunk[size_t(i)] = tokens[size_t(c) * ctx + i];
    if (bos >= 0) chunk[0] = bos;
    ref.reset();
    pol.reset();
    if (!same) ref.eval(chunk.data(), first);  // the context half: not scored
    pol.eval(chunk.data(), first);
    for_each_scored_piece(ctx, [&](int p0, int n) {
      const int32_t* piece = &chunk[size_t(p0)];
      const std::vector<float>& lg = pol.eval(piece, n, /*all_logits=*/true);  // [n, n_vocab]
      const std::vector<float>& rl = same ? lg : ref.eval(piece, n, /*all_logits=*/true);  // [n, n_vocab]
      for (int j = p0; j < std::min(p0 + n, ctx - 1); ++j) {
        const int target = tokens[size_t(c) * ctx + j + 1];
        const float* q = &lg[size_t(j - p0) * nv];
        const float* p = &rl[size_t(j - p0) * nv];
        nll += token_nll(q, nv, target);
        nll_ref += token_nll(p, nv, target);
        if (!same) {
          log_softmax(p, nv, lp);
          log_softmax(q, nv, lq);
          double d = 0;
          for (int i = 0; i < nv; ++i) d += std::exp(lp[size_t(i)]) * (lp[size_t(i)] - lq[size_t(i)]);
          kl += std::max(0.0, d);
        }
        agree += argmax(p, nv) == argmax(q, nv);
        ++r.n_scored;
      }
    });
    if (progress) progress(c + 1, r.n_chunks, std::exp(nll / double(r.n_scored)));
  }
  r.ppl = std::exp(nll / double(r.n_scored));
  r.ppl_ref = std::exp(nll_ref / double(r.n_scored));
  r.kl = kl / double(r.n_scored);
  r.top1 = double(agree) / double(r.n_scored);
  return r;
}

StreamEvalResult stream_eval(Engine& e, const std::vector<int>& tokens, const StreamEvalOptions& o,
                             const std::function<void(int64_t, int64_t, double)>& progress) {
  if (tokens.size() < 2) throw std::invalid_argument("stream eval: need at least 2 tokens");
  if (o.segment < 1 || o.oracle_stride < 1 || o.oracle_window < 1)
    throw std::invalid_argument("stream eval: segment, stride and window must be >= 1");
  const int nv = e.model().config().n_vocab;
  const int64_t n = int64_t(tokens.size());
  StreamEvalResult r;
  double total = 0, seg = 0;
  int64_t seg_n = 0;
  auto score = [&](int64_t i, const float* logits) {  // logits predict tokens[i + 1]
    const double l = token_nll(logits, nv, tokens[size_t(i + 1)]);
    total += l;
    seg += l;
    ++seg_n;
    ++r.n_scored;
  };
  auto close_segment = [&](int64_t processed, bool force) {
    if (seg_n == 0 || (!force && processed % o.segment != 0)) return;
    r.segment_ppl.emplace_back(processed, std::exp(seg / double(seg_n)));
    seg = 0;
    seg_n = 0;
    if (progress) progress(processed, n, std::exp(total / double(r.n_scored)));
  };
  if (o.oracle) {
    // Exact window attention: tokens [i - W + 1, i] from scratch, positions 0..W-1.
    const int W = o.oracle_window;
    LocalSequence seq(e, W, o.block_size, o.cache);
    r.peak_blocks = int((W + o.block_size - 1) / o.block_size);
    r.peak_kv_bytes = int64_t(r.peak_blocks) * seq.block_bytes();
    for (int64_t i = 0; i + 1 < n; ++i) {
      if (i % o.oracle_stride == 0) {
        const int64_t from = std::max<int64_t>(0, i - W + 1);
        seq.reset();
        const std::vector<float>& lg = seq.eval(&tokens[size_t(from)], int(i - from + 1));
        score(i, lg.data());
      }
      close_segment(i + 1, false);
    }
  } else {
    if (!o.window.active()) throw std::invalid_argument("stream eval: give a window policy or the oracle");
    LocalSequence seq(e, int(std::min<int64_t>(n, INT32_MAX)), o.block_size, o.cache, o.window);
    for (int64_t i = 0; i + 1 < n; ++i) {
      const int32_t t = tokens[size_t(i)];
      const std::vector<float>& lg = seq.eval(&t, 1);
      score(i, lg.data());
      close_segment(i + 1, false);
    }
    r.peak_blocks = seq.peak_blocks();
    r.peak_kv_bytes = int64_t(seq.peak_blocks()) * seq.block_bytes() +
                      int64_t(seq.layout().residual_floats() * sizeof(float));
  }
  close_segment(n - 1, true);
  r.ppl = std::exp(total / double(r.n_scored));
  return r;
}

}  // namespace kvs
