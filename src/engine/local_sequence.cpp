#include "engine/local_sequence.h"

#include <stdexcept>
#include <string>

#include "model/model.h"

namespace kvs {

static KvLayout layout_for(const Model& m, int block_size) {
  KvLayout l;
  l.n_layers = m.config().n_layers;
  l.n_kv_heads = m.config().n_kv_heads;
  l.head_dim = m.config().head_dim;
  l.block_size = block_size;
  return l;
}

LocalSequence::LocalSequence(Engine& e, int max_ctx, int block_size)
    : e_(e),
      max_ctx_(max_ctx),
      storage_(layout_for(e.model(), block_size), (max_ctx + block_size - 1) / block_size) {
  if (max_ctx < 1) throw std::invalid_argument("context size must be >= 1");
  table_.resize(storage_.n_blocks());
  for (size_t i = 0; i < table_.size(); ++i) table_[i] = int32_t(i);
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
    SeqChunk ch{table_.data(), n_past_, tokens + done, m, all_logits};
    e_.forward({ch}, storage_.view(), part_);
    if (all_logits) logits_.insert(logits_.end(), part_.begin(), part_.end());
    n_past_ += m;
    done += m;
    if (!all_logits && done == n) logits_.assign(part_.end() - nv, part_.end());
  }
  return logits_;
}

}  // namespace kvs
