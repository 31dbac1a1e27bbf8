#include "engine/local_sequence.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "model/model.h"

namespace kvs {

namespace {
int64_t blocks_needed(int max_ctx, int bs, const WindowPolicy& w) {
  if (max_ctx < 1) throw std::invalid_argument("context size must be >= 1");
  const int64_t all = (int64_t(max_ctx) + bs - 1) / bs;
  // A bounding window: one chunk is written at a time.
  return std::min(all, window_block_cap(w, bs, LocalSequence::kMaxWindowChunk));
}
}  // namespace

LocalSequence::LocalSequence(Engine& e, int max_ctx, int block_size, const KvCacheOptions& cache,
                             const WindowPolicy& window)
    : e_(e),
      max_ctx_(max_ctx),
      window_(window.in_force(e.model().config().sliding_window)),
      storage_(kv_layout_for(e, block_size, cache), blocks_needed(max_ctx, block_size, window_)) {
  residual_.assign(storage_.view().layout.residual_floats(), 0.0f);
  reset();
}

void LocalSequence::reset() {
  n_past_ = 0;
  table_.clear();
  free_.clear();
  for (int32_t b = int32_t(storage_.n_blocks()) - 1; b >= 0; --b) free_.push_back(b);  // block 0 first
}

void LocalSequence::truncate(int n) {
  if (n >= n_past_) return;
  const KvLayout& l = storage_.view().layout;
  if (window_.active() && window_.dead_range(n_past_).second > 0)
    throw std::invalid_argument("a windowed sequence cannot be truncated once tokens left its window");
  if (l.quantized() && n % l.group_tokens != 0 && n / l.group_tokens != n_past_ / l.group_tokens)
    throw std::invalid_argument("a quantized KV cache can only be truncated to a multiple of " +
                                std::to_string(l.group_tokens) + " tokens");
  n_past_ = std::max(n, 0);
}

void LocalSequence::ensure_blocks(int n_tokens) {
  const int bs = storage_.view().layout.block_size;
  while (int64_t(table_.size()) * bs < n_tokens) {
    if (free_.empty())
      throw std::logic_error("local sequence: out of KV blocks (" + std::to_string(storage_.n_blocks()) + ")");
    table_.push_back(free_.back());
    free_.pop_back();
  }
  peak_blocks_ = std::max(peak_blocks_, live_blocks());
}

void LocalSequence::free_dead() {
  if (!window_.active()) return;
  const int bs = storage_.view().layout.block_size;
  const auto [lo, hi] = window_.dead_range(n_past_);
  // Whole blocks inside [lo, hi): no token at n_past or later sees them.
  for (int64_t b = (int64_t(lo) + bs - 1) / bs; (b + 1) * bs <= hi && b < int64_t(table_.size()); ++b) {
    if (table_[size_t(b)] < 0) continue;
    free_.push_back(table_[size_t(b)]);
    table_[size_t(b)] = -1;
  }
}

const std::vector<float>& LocalSequence::eval(const int32_t* tokens, int n, bool all_logits, int max_chunk) {
  if (n < 1) throw std::invalid_argument("eval: no tokens");
  if (int64_t(n_past_) + n > max_ctx_)
    throw std::length_error("context full: " + std::to_string(int64_t(n_past_) + n) + " tokens > context size " +
                            std::to_string(max_ctx_) + " (raise --ctx)");
  if (max_chunk <= 0) max_chunk = window_.max_visible() > 0 ? kMaxWindowChunk : n;
  if (window_.max_visible() > 0) max_chunk = std::min(max_chunk, int(kMaxWindowChunk));
  logits_.clear();
  const int nv = e_.model().config().n_vocab;
  for (int done = 0; done < n;) {
    const int m = std::min(max_chunk, n - done);
    ensure_blocks(n_past_ + m);
    SeqChunk ch{table_.data(), n_past_, tokens + done, m, all_logits, residual_.empty() ? nullptr : residual_.data(),
                &window_};
    e_.forward({ch}, storage_.view(), part_);
    if (all_logits) logits_.insert(logits_.end(), part_.begin(), part_.end());
    n_past_ += m;
    done += m;
    free_dead();
    if (!all_logits && done == n) logits_.assign(part_.end() - nv, part_.end());
  }
  return logits_;
}

namespace {
void put(std::vector<uint8_t>& out, const void* p, size_t n) {
  if (n == 0) return;  // p may be null (an empty residual)
  const auto* b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}
template <class T>
void put_pod(std::vector<uint8_t>& out, T v) {
  put(out, &v, sizeof v);
}
struct Reader {
  const std::vector<uint8_t>& in;
  size_t at = 0;
  void get(void* p, size_t n) {
    if (n > in.size() - at) throw std::invalid_argument("saved sequence state is truncated");
    if (n == 0) return;  // p may be null (an empty residual)
    std::memcpy(p, in.data() + at, n);
    at += n;
  }
  template <class T>
  T pod() {
    T v;
    get(&v, sizeof v);
    return v;
  }
};
constexpr uint32_t kStateMagic = 0x4b565351;  // "QSVK"
}  // namespace

std::vector<uint8_t> LocalSequence::save_state() const {
  const KvLayout& l = storage_.view().layout;
  std::vector<uint8_t> out;
  const std::string desc = l.describe() + " bs" + std::to_string(l.block_size) + " L" + std::to_string(l.n_layers) +
                           " kv" + std::to_string(l.kvdim());
  put_pod(out, kStateMagic);
  put_pod(out, uint32_t(desc.size()));
  put(out, desc.data(), desc.size());
  put_pod(out, int32_t(n_past_));
  put_pod(out, uint32_t(table_.size()));
  for (int32_t b : table_) put_pod(out, uint8_t(b >= 0));
  put_pod(out, uint64_t(residual_.size()));
  put(out, residual_.data(), residual_.size() * sizeof(float));
  for (int32_t b : table_)
    if (b >= 0) put(out, storage_.view().base + size_t(b) * l.block_bytes(), l.block_bytes());
  return out;
}

void LocalSequence::load_state(const std::vector<uint8_t>& bytes) {
  const KvLayout& l = storage_.view().layout;
  Reader r{bytes};
  if (r.pod<uint32_t>() != kStateMagic) throw std::invalid_argument("not a saved sequence state");
  const uint32_t dn = r.pod<uint32_t>();
  if (dn > 4096) throw std::invalid_argument("saved sequence state is malformed");
  std::string desc(dn, '\0');
  r.get(desc.data(), dn);
  const std::string mine = l.describe() + " bs" + std::to_string(l.block_size) + " L" + std::to_string(l.n_layers) +
                           " kv" + std::to_string(l.kvdim());
  if (desc != mine) throw std::invalid_argument("saved KV layout '" + desc + "' differs from this one '" + mine + "'");
  const int32_t n = r.pod<int32_t>();
  const uint32_t tn = r.pod<uint32_t>();
  if (n < 0 || n > max_ctx_ || int64_t(tn) * l.block_size < n || tn > uint32_t(1) << 26)
    throw std::invalid_argument("saved sequence state does not fit this sequence");
  std::vector<uint8_t> live(tn);
  r.get(live.data(), tn);
  if (r.pod<uint64_t>() != residual_.size()) throw std::invalid_argument("saved residual size differs");
  reset();
  r.get(residual_.data(), residual_.size() * sizeof(float));
  for (uint32_t i = 0; i < tn; ++i) {
    if (!live[i]) {
      table_.push_back(-1);
      continue;
    }
    if (free_.empty()) throw std::invalid_argument("saved sequence holds more blocks than this one has");
    table_.push_back(free_.back());
    free_.pop_back();
    r.get(storage_.view().base + size_t(table_.back()) * l.block_bytes(), l.block_bytes());
  }
  if (r.at != bytes.size()) throw std::invalid_argument("saved sequence state has trailing bytes");
  n_past_ = n;
  peak_blocks_ = std::max(peak_blocks_, live_blocks());
}

}  // namespace kvs
