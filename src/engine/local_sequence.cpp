#include "engine/local_sequence.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "model/model.h"

namespace kvs {

namespace {
int64_t blocks_needed(int max_ctx, int bs, const std::vector<TableWindow>& tw) {
  if (max_ctx < 1) throw std::invalid_argument("context size must be >= 1");
  // A bounding window: one chunk is written at a time.
  return sequence_block_cap(tw, max_ctx, bs, LocalSequence::kMaxWindowChunk);
}
}  // namespace

LocalSequence::LocalSequence(Engine& e, int max_ctx, int block_size, const KvCacheOptions& cache,
                             const WindowPolicy& window)
    : e_(e),
      max_ctx_(max_ctx),
      window_(window.in_force(e.model().config().sliding_window)),
      tw_(table_windows(window_, kv_layout_for(e, block_size, cache).groups)),
      storage_(kv_layout_for(e, block_size, cache), blocks_needed(max_ctx, block_size, tw_)) {
  residual_.assign(storage_.view().layout.residual_floats(), 0.0f);
  reset();
}

void LocalSequence::reset() {
  n_past_ = 0;
  tables_.assign(tw_.size(), {});
  free_.clear();
  for (int32_t b = int32_t(storage_.n_blocks()) - 1; b >= 0; --b) free_.push_back(b);  // block 0 first
}

bool LocalSequence::frees() const {
  for (const TableWindow& w : tw_)
    if (w.frees()) return true;
  return false;
}

int LocalSequence::live_blocks(int table) const {
  int n = 0;
  for (int32_t b : tables_.at(size_t(table))) n += b >= 0;
  return n;
}

void LocalSequence::truncate(int n) {
  if (n >= n_past_) return;
  const KvLayout& l = storage_.view().layout;
  for (const std::vector<int32_t>& tb : tables_)
    if (std::find(tb.begin(), tb.end(), -1) != tb.end())
      throw std::invalid_argument("a windowed sequence cannot be truncated once tokens left its window");
  if (l.quantized() && n % l.group_tokens != 0 && n / l.group_tokens != n_past_ / l.group_tokens)
    throw std::invalid_argument("a quantized KV cache can only be truncated to a multiple of " +
                                std::to_string(l.group_tokens) + " tokens");
  n_past_ = std::max(n, 0);
}

void LocalSequence::ensure_blocks(int n_tokens) {
  const int bs = storage_.view().layout.block_size;
  for (std::vector<int32_t>& tb : tables_)
    while (int64_t(tb.size()) * bs < n_tokens) {
      if (free_.empty())
        throw std::logic_error("local sequence: out of KV blocks (" + std::to_string(storage_.n_blocks()) + ")");
      tb.push_back(free_.back());
      free_.pop_back();
    }
  peak_blocks_ = std::max(peak_blocks_, live_blocks());
}

void LocalSequence::free_dead() {
  const int bs = storage_.view().layout.block_size;
  for (size_t t = 0; t < tw_.size(); ++t) {
    if (!tw_[t].frees()) continue;
    std::vector<int32_t>& tb = tables_[t];
    // Whole blocks no token at n_past or later sees.
    for (int64_t b = 0; b < int64_t(tb.size()); ++b) {
      if (tb[size_t(b)] < 0 || !tw_[t].dead(b * bs, (b + 1) * bs, n_past_)) continue;
      free_.push_back(tb[size_t(b)]);
      tb[size_t(b)] = -1;
    }
  }
}

const std::vector<float>& LocalSequence::eval(const int32_t* tokens, int n, bool all_logits, int max_chunk) {
  if (n < 1) throw std::invalid_argument("eval: no tokens");
  if (int64_t(n_past_) + n > max_ctx_)
    throw std::length_error("context full: " + std::to_string(int64_t(n_past_) + n) + " tokens > context size " +
                            std::to_string(max_ctx_) + " (raise --ctx)");
  // Under a window the storage holds one chunk of kMaxWindowChunk tokens
  // beyond what the windows keep.
  const bool bounded = frees();
  // Longer prompts run in forwards of kDefaultChunk tokens: the activations
  // stay bounded and in cache (the bits are the same in any chunking).
  if (max_chunk <= 0) max_chunk = kDefaultChunk;
  if (bounded) max_chunk = std::min(max_chunk, int(kMaxWindowChunk));
  logits_.clear();
  const int nv = e_.model().config().n_vocab;
  for (int done = 0; done < n;) {
    const int m = std::min(max_chunk, n - done);
    ensure_blocks(n_past_ + m);
    table_ptrs_.clear();
    for (const std::vector<int32_t>& tb : tables_) table_ptrs_.push_back(tb.data());
    SeqChunk ch{tables_[0].data(), n_past_, tokens + done, m, all_logits,
                residual_.empty() ? nullptr : residual_.data(), &window_};
    if (tables_.size() > 1) ch.block_tables = table_ptrs_.data();
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
  // Table 0's length and live flags, then the other tables' flags (a hybrid
  // layout, which the description names; all tables have one length).
  put_pod(out, uint32_t(tables_[0].size()));
  for (const std::vector<int32_t>& tb : tables_)
    for (int32_t b : tb) put_pod(out, uint8_t(b >= 0));
  put_pod(out, uint64_t(residual_.size()));
  put(out, residual_.data(), residual_.size() * sizeof(float));
  for (const std::vector<int32_t>& tb : tables_)
    for (int32_t b : tb)
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
  if (n > max_ctx_ && n <= 1 << 26)
    throw std::invalid_argument("the saved state holds " + std::to_string(n) + " tokens, more than this context of " +
                                std::to_string(max_ctx_) + ": resume with a context (-c) of at least " +
                                std::to_string(n) + ", or without -c");
  if (n < 0 || n > max_ctx_ || int64_t(tn) * l.block_size < n || tn > uint32_t(1) << 26)
    throw std::invalid_argument("saved sequence state does not fit this sequence");
  std::vector<uint8_t> live(size_t(tn) * tw_.size());
  r.get(live.data(), live.size());
  if (r.pod<uint64_t>() != residual_.size()) throw std::invalid_argument("saved residual size differs");
  reset();
  r.get(residual_.data(), residual_.size() * sizeof(float));
  for (size_t t = 0; t < tw_.size(); ++t)
    for (uint32_t i = 0; i < tn; ++i) {
      if (!live[t * tn + i]) {
        tables_[t].push_back(-1);
        continue;
      }
      if (free_.empty()) throw std::invalid_argument("saved sequence holds more blocks than this one has");
      tables_[t].push_back(free_.back());
      free_.pop_back();
      r.get(storage_.view().base + size_t(tables_[t].back()) * l.block_bytes(), l.block_bytes());
    }
  if (r.at != bytes.size()) throw std::invalid_argument("saved sequence state has trailing bytes");
  n_past_ = n;
  peak_blocks_ = std::max(peak_blocks_, live_blocks());
}

}  // namespace kvs
