#include "engine/local_sequence.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "model/model.h"

namespace kvs {

LocalSequence::LocalSequence(Engine& e, int max_ctx, int block_size, const KvCacheOptions& cache)
    : e_(e),
      max_ctx_(max_ctx),
      storage_(kv_layout_for(e, block_size, cache), (std::max(max_ctx, 1) + block_size - 1) / block_size) {
  if (max_ctx < 1) throw std::invalid_argument("context size must be >= 1");
  table_.resize(storage_.n_blocks());
  for (size_t i = 0; i < table_.size(); ++i) table_[i] = int32_t(i);
  residual_.assign(storage_.view().layout.residual_floats(), 0.0f);
}

void LocalSequence::truncate(int n) {
  if (n >= n_past_) return;
  const KvLayout& l = storage_.view().layout;
  if (l.quantized() && n % l.group_tokens != 0 && n / l.group_tokens != n_past_ / l.group_tokens)
    throw std::invalid_argument("a quantized KV cache can only be truncated to a multiple of " +
                                std::to_string(l.group_tokens) + " tokens");
  n_past_ = std::max(n, 0);
}

const std::vector<float>& LocalSequence::eval(const int32_t* tokens, int n, bool all_logits, int max_chunk) {
  if (n < 1) throw std::invalid_argument("eval: no tokens");
  if (n_past_ + n > max_ctx_)
    throw std::length_error("context full: " + std::to_string(n_past_ + n) + " tokens > context size " +
                            std::to_string(max_ctx_) + " (raise --ctx)");
  if (max_chunk <= 0) max_chunk = n;
  logits_.clear();
  const int nv = e_.model().config().n_vocab;
  for (int done = 0; done < n;) {
    const int m = std::min(max_chunk, n - done);
    SeqChunk ch{table_.data(), n_past_, tokens + done, m, all_logits, residual_.empty() ? nullptr : residual_.data()};
    e_.forward({ch}, storage_.view(), part_);
    if (all_logits) logits_.insert(logits_.end(), part_.begin(), part_.end());
    n_past_ += m;
    done += m;
    if (!all_logits && done == n) logits_.assign(part_.end() - nv, part_.end());
  }
  return logits_;
}

}  // namespace kvs
