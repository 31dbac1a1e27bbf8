#include "fake_executor.h"

#include <stdexcept>
#include <string>
#include <unordered_set>

namespace kvs::sched {

static KvManagerOptions manager_options(const FakeExecutorOptions& o) {
  KvManagerOptions m = KvManagerOptions::basic(o.block_size, o.prefix_caching);
  m.table_windows = o.table_windows;
  m.max_step_tokens = o.max_step_tokens;
  return m;
}

FakeExecutor::FakeExecutor(const FakeExecutorOptions& o) : o_(o), kv_(o.n_blocks, manager_options(o), nullptr) {
  if (o.n_vocab < 2) throw std::invalid_argument("fake executor: n_vocab must be >= 2");
}

SeqAdmission FakeExecutor::add(std::span<const int32_t> prompt, const Scope& caller, bool use_cache) {
  if (prompt.empty()) throw std::invalid_argument("fake executor: empty prompt");
  return kv_.add_sequence(prompt, caller, nullptr, use_cache);
}

int32_t FakeExecutor::next_token(std::span<const int32_t> h) const {
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int32_t t : h) x = (x ^ uint64_t(uint32_t(t))) * 0x100000001b3ull + (x >> 29);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  if (o_.eos >= 0 && x % 97 == 0) return o_.eos;  // rare end of text
  int32_t t = int32_t(x % uint64_t(o_.n_vocab));
  if (t == o_.eos) t = (t + 1) % o_.n_vocab;
  return t;
}

StepResult FakeExecutor::step(const std::vector<SeqStep>& items) {
  StepResult r;
  r.n_vocab = o_.n_vocab;
  std::unordered_set<SeqId> seen;
  for (const SeqStep& it : items) {
    if (it.tokens.empty() || !seen.insert(it.seq).second) throw std::invalid_argument("fake executor: bad step item");
    if (kv_.num_tokens(it.seq) + int(it.tokens.size()) > o_.max_ctx)
      throw std::length_error("fake executor: sequence past the context");
  }
  size_t done = 0;
  for (; done < items.size(); ++done)
    if (!kv_.reserve(items[done].seq, int(items[done].tokens.size()))) break;
  if (done < items.size()) {
    for (size_t i = 0; i < done; ++i) kv_.unreserve(items[i].seq);
    r.no_room.push_back(items[done].seq);
    return r;
  }
  if (on_step) on_step();
  if (fault) fault(items);
  int tokens = 0;
  std::vector<int32_t> hist;
  for (const SeqStep& it : items) {
    hist = kv_.tokens(it.seq);
    hist.insert(hist.end(), it.tokens.begin(), it.tokens.end());
    r.row0.push_back(int64_t(r.logits.size()) / o_.n_vocab);
    const int rows = it.all_logits ? int(it.tokens.size()) : 1;
    for (int k = rows; k >= 1; --k) {
      const size_t len = hist.size() - size_t(k - 1);
      const int32_t best = next_token(std::span<const int32_t>(hist.data(), len));
      const size_t at = r.logits.size();
      r.logits.resize(at + size_t(o_.n_vocab));
      for (int v = 0; v < o_.n_vocab; ++v) r.logits[at + v] = -float((v * 7 + int(len)) % 13) * 0.25f;
      r.logits[at + best] = 4.0f;
    }
    kv_.commit(it.seq, it.tokens);
    tokens += int(it.tokens.size());
  }
  step_tokens.push_back(tokens);
  step_seqs.push_back(int(items.size()));
  r.ok = true;
  return r;
}

}  // namespace kvs::sched
