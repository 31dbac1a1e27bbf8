#include "chat/chat_session.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "chat/session_bytes.h"
#include "engine/generate.h"
#include "kernels/threadpool.h"
#include "model/model.h"

namespace kvs::chat {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A sliding-window sequence is never full; its memory is bounded by the policy.
constexpr int kUnboundedCtx = 1 << 30;

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

std::vector<std::string> stop_strings(const server::ChatTemplate& t) {
  // Templates with control tokens end a turn with an end-of-turn token; the
  // plain fallback has only its role prefixes to stop at.
  if (t.family() == server::ChatFamily::Plain) return {"\nuser:", "\nsystem:"};
  return {};
}
}  // namespace

ChatSession::ChatSession(Engine& engine, const Tokenizer& tok, server::ChatTemplate tmpl, ChatOptions o)
    : engine_(engine), tok_(tok), o_(std::move(o)), conv_(std::move(tmpl), o_.system), cache_now_(o_.cache) {
  if (o_.hard_cap <= 0) o_.hard_cap = engine_.model().config().n_ctx_train;
  if (o_.hard_cap < 32) throw std::invalid_argument("chat: the hard cap must be at least 32 tokens");
  if (o_.window <= 0) o_.window = o_.hard_cap / 2;
  if (o_.window >= o_.hard_cap) throw std::invalid_argument("chat: the window must be below the hard cap");
  if (o_.max_tokens < 1 || o_.max_tokens >= o_.window)
    throw std::invalid_argument("chat: max tokens per reply must be in [1, window)");
  if (o_.summary_tokens == 0) o_.summary_tokens = std::min(64, o_.window / 4);
  if (o_.summary && (o_.summary_tokens < 1 || 2 * o_.summary_tokens >= o_.window))
    throw std::invalid_argument("chat: the summary budget must be in [1, window / 2)");
  if (!o_.summary && (o_.sinks < 0 || o_.sinks >= o_.hard_cap))
    throw std::invalid_argument("chat: attention sinks must be in [0, hard cap)");
  rebuild();
}

void ChatSession::set_thread_share(double share) {
  const int all = engine_.n_threads();
  engine_.pool().set_active_threads(share >= 1 ? all : std::max(1, int(double(all) * share + 0.5)));
}

int ChatSession::reply_budget() const {
  return max_tokens_cap_ > 0 ? std::min(o_.max_tokens, max_tokens_cap_) : o_.max_tokens;
}

void ChatSession::rebuild() {
  const bool new_format =
      rebuild_cache_ && (rebuild_cache_->type != cache_now_.type || rebuild_cache_->key_scale != cache_now_.key_scale ||
                         rebuild_cache_->residual != cache_now_.residual ||
                         rebuild_cache_->group_channels != cache_now_.group_channels);
  if (rebuild_cache_) cache_now_ = *rebuild_cache_;
  if (seq_ && !new_format) {
    seq_->reset();
  } else {
    seq_.reset();  // the old storage goes before the new one is allocated
    const WindowPolicy w = o_.summary ? WindowPolicy{} : WindowPolicy::streaming(o_.hard_cap - o_.sinks, o_.sinks);
    seq_ = std::make_unique<LocalSequence>(engine_, o_.summary ? o_.hard_cap : kUnboundedCtx, o_.block_size,
                                           cache_now_, w);
  }
  kv_text_.clear();
}

void ChatSession::reset() {
  conv_.clear();
  summary_tok_count_ = 0;
  rebuild();
}

int ChatSession::count_tokens(const std::string& text) const {
  return int(tok_.encode(text, tok_.vocab().add_bos, true).size());
}

std::string ChatSession::cut_tokens(const std::string& text, int n) const {
  std::vector<int> ids = tok_.encode(text, false, true);
  std::string out = text;
  if (int(ids.size()) > n) {
    ids.resize(size_t(std::max(0, n)));
    out = tok_.decode(ids);
  }
  const size_t a = out.find_first_not_of(" \n\t"), b = out.find_last_not_of(" \n\t");
  return a == std::string::npos ? std::string() : out.substr(a, b - a + 1);
}

void ChatSession::note(const std::string& what) {
  notice_ += (notice_.empty() ? "" : "; ") + what;
  if (notice_sink_) notice_sink_(what);
}

void ChatSession::make_room(const std::string& user) {
  const int budget = reply_budget();
  // A message that cannot fit even alone is refused before anything is
  // evicted, so refusing it costs the conversation nothing.
  if (count_tokens(conv_.render_alone(user)) + budget > o_.hard_cap)
    throw std::length_error("chat: the message does not fit the hard cap of " + std::to_string(o_.hard_cap) +
                            " tokens with a reply of " + std::to_string(budget) + " (shorten it or raise --ctx)");
  std::vector<Turn> evicted;
  while (!conv_.turns().empty() && count_tokens(conv_.render(user)) + budget > o_.window)
    evicted.push_back(conv_.pop_oldest());
  turns_evicted_ += int(evicted.size());
  if (!evicted.empty()) {
    conv_.set_summary(summarize(evicted));
    ++summaries_;
  }
  fit_cap(user);
  rebuild();
}

void ChatSession::fit_cap(const std::string& user) {
  // The new summary may be longer than the one the evictions were measured
  // with. What gives way, in order: the summary beyond its budget, more old
  // turns, half the summary at a time, and at last all of it (a fresh start
  // but for the system prompt; make_room checked that the message fits then).
  const int budget = reply_budget();
  auto over = [&] { return count_tokens(conv_.render(user)) + budget > o_.hard_cap; };
  conv_.set_summary(cut_tokens(conv_.summary(), o_.summary_tokens));
  const int before = conv_.summary().empty() ? 0 : int(tok_.encode(conv_.summary(), false, true).size());
  summary_tok_count_ = before;
  int dropped = 0;
  while (over() && !conv_.turns().empty()) {
    conv_.pop_oldest();
    ++dropped;
  }
  turns_evicted_ += dropped;
  if (dropped > 0)
    note(std::to_string(dropped) + " more old turn(s) dropped without a summary to fit the hard cap of " +
         std::to_string(o_.hard_cap) + " tokens");
  while (over() && !conv_.summary().empty()) {
    summary_tok_count_ /= 2;
    conv_.set_summary(cut_tokens(conv_.summary(), summary_tok_count_));
  }
  if (conv_.summary().empty()) summary_tok_count_ = 0;
  if (before > 0 && conv_.summary().empty())
    note("the conversation so far no longer fits the hard cap of " + std::to_string(o_.hard_cap) +
         " tokens with this message; starting fresh (raise --ctx to keep more)");
  else if (summary_tok_count_ < before)
    note("summary cut to " + std::to_string(summary_tok_count_) + " tokens to fit the hard cap of " +
         std::to_string(o_.hard_cap) + " tokens");
}

std::vector<int32_t> ChatSession::prompt_tokens(const std::string& user, bool& rebuilt) {
  std::string text = conv_.render(user);
  std::vector<int> ids;
  rebuilt = kv_text_.empty() || !starts_with(text, kv_text_);
  if (!rebuilt) ids = tok_.encode(std::string_view(text).substr(kv_text_.size()), false, true);
  if (o_.summary && !rebuilt && seq_->n_past() + int(ids.size()) + reply_budget() > o_.hard_cap) {
    make_room(user);
    text = conv_.render(user);
    rebuilt = true;
  } else if (rebuilt) {
    rebuild();
  }
  if (rebuilt) {
    ids = tok_.encode(text, tok_.vocab().add_bos, true);
    if (o_.summary && int(ids.size()) + reply_budget() > o_.hard_cap) {
      make_room(user);
      text = conv_.render(user);
      ids = tok_.encode(text, tok_.vocab().add_bos, true);
    }
  }
  kv_text_ = text;
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string ChatSession::summarize(const std::vector<Turn>& evicted) {
  const std::string instruction =
      "Condense the conversation into a short summary that keeps names, facts, decisions and open questions.";
  std::string body = transcript(evicted), earlier = cut_tokens(conv_.summary(), o_.summary_tokens);
  std::vector<int> ids;
  int gen = o_.summary_tokens;
  // The input is bounded by the sequence itself: prompt + summary fit the cap.
  // The longer of the transcript and the earlier summary loses its oldest
  // quarter first; with both gone the new summary gets what room is left.
  for (;;) {
    std::string ask = (earlier.empty() ? "" : "Earlier summary: " + earlier + "\n\n") + "Conversation:\n" + body +
                      "\nWrite the new summary.";
    ids = tok_.encode(render_messages(conv_.chat_template(), {{"system", instruction}, {"user", ask}}),
                      tok_.vocab().add_bos, true);
    if (int(ids.size()) + gen <= o_.hard_cap) break;
    std::string& cut = body.size() >= earlier.size() ? body : earlier;
    if (cut.empty()) {
      gen = o_.hard_cap - int(ids.size());
      break;
    }
    cut.erase(0, std::max<size_t>(1, cut.size() / 4));
  }
  if (gen < 1) {
    // fit_cap() bounds and counts what is kept of the earlier summary.
    note("the hard cap of " + std::to_string(o_.hard_cap) + " tokens leaves no room to summarize; " +
         std::to_string(evicted.size()) + " old turn(s) dropped without a summary (raise --ctx to keep them)");
    return conv_.summary();
  }
  rebuild();
  std::vector<int32_t> pt(ids.begin(), ids.end());
  std::vector<float> logits = seq_->eval(pt);
  SamplingParams greedy;
  greedy.temperature = 0;
  Sampler sampler(greedy);
  Detokenizer detok(tok_);
  std::string out;
  const int nv = engine_.model().config().n_vocab;
  for (int i = 0; i < gen; ++i) {
    const int id = sampler.sample(logits.data(), nv, {});
    if (ends_generation(tok_, id)) break;
    out += detok.push(id);
    if (i + 1 == gen) break;
    const int32_t t = id;
    logits = seq_->eval(&t, 1);
  }
  out += detok.flush();
  // fit_cap() bounds it again in tokens: re-encoded text can take more
  // tokens than were generated.
  return out;
}

void ChatSession::decode(std::vector<float> logits, int budget, const std::function<bool(const std::string&)>& on_text,
                         ReplyResult& r) {
  Sampler sampler(o_.sampling);
  Detokenizer detok(tok_);
  StopMatcher stop(stop_strings(conv_.chat_template()));
  std::vector<int> history;
  const int nv = engine_.model().config().n_vocab;
  bool go_on = true, stopped = false, fed_last = true;
  std::string raw;
  auto emit = [&](const std::string& s) {
    if (s.empty()) return;
    r.text += s;
    if (on_text && !on_text(s)) go_on = false;
  };
  r.finish_reason = "length";
  Clock::time_point last = Clock::now();
  for (int i = 0; i < budget && go_on; ++i) {
    const int id = sampler.sample(logits.data(), nv, history);
    if (ends_generation(tok_, id)) {
      r.finish_reason = "stop";
      break;
    }
    if (i > 0) tpot_.add(since(last));
    last = Clock::now();
    history.push_back(id);
    ++r.tokens;
    const std::string piece = detok.push(id);
    raw += piece;
    emit(stop.push(piece, stopped));
    fed_last = false;
    if (stopped) {
      r.finish_reason = "stop";
      break;
    }
    if (i + 1 == budget || !go_on) break;
    const int32_t t = id;
    logits = seq_->eval(&t, 1);
    fed_last = true;
  }
  if (!go_on && r.finish_reason == "length") r.finish_reason = "cancelled";
  const std::string tail = detok.flush();
  raw += tail;
  if (!stopped) {
    emit(stop.push(tail, stopped));
    if (!stopped) emit(stop.flush());
  }
  // The KV must hold exactly kv_text_: the last sampled token goes in too.
  if (!fed_last) {
    const int32_t t = history.back();
    seq_->eval(&t, 1);
  }
  kv_text_ += raw;
}

ReplyResult ChatSession::reply(const std::string& user, const std::function<bool(const std::string&)>& on_text) {
  ReplyResult r;
  const Clock::time_point t0 = Clock::now();
  notice_.clear();
  const std::vector<int32_t> pt = prompt_tokens(user, r.rebuilt);
  r.notice = notice_;
  r.prompt_tokens = int(pt.size());
  std::vector<float> logits = seq_->eval(pt);
  r.ttft_s = since(t0);
  last_ttft_s_ = r.ttft_s;
  last_prompt_tokens_ = r.prompt_tokens;
  decode(std::move(logits), reply_budget(), on_text, r);
  conv_.add_turn(user, r.text);
  return r;
}

ChatStats ChatSession::stats() const {
  ChatStats s;
  s.live_blocks = seq_->live_blocks();
  s.peak_blocks = seq_->peak_blocks();
  s.capacity_blocks = seq_->capacity_blocks();
  s.kv_bytes = int64_t(s.live_blocks) * seq_->block_bytes();
  s.n_past = seq_->n_past();
  s.hard_cap = o_.hard_cap;
  s.window = o_.summary ? o_.window : o_.hard_cap - o_.sinks;
  s.max_tokens = reply_budget();
  s.summary_mode = o_.summary;
  s.summary = conv_.summary();
  s.summary_tokens = summary_tok_count_;
  s.turns_kept = int(conv_.turns().size());
  s.turns_evicted = turns_evicted_;
  s.summaries = summaries_;
  s.tpot_p50_s = tpot_.quantile(0.5);
  s.tpot_p99_s = tpot_.quantile(0.99);
  s.tpot_samples = tpot_.total();
  s.kv_desc = seq_->layout().describe();
  s.window_desc = seq_->window().describe();
  s.last_ttft_s = last_ttft_s_;
  s.last_prompt_tokens = last_prompt_tokens_;
  return s;
}

namespace {
constexpr uint32_t kSnapshotVersion = 1;
}  // namespace

std::vector<uint8_t> ChatSession::snapshot() const {
  ByteWriter w;
  w.u32(kSnapshotVersion);
  w.str(conv_.system());
  w.str(conv_.summary());
  w.u32(uint32_t(conv_.turns().size()));
  for (const Turn& t : conv_.turns()) {
    w.str(t.user);
    w.str(t.assistant);
  }
  w.str(kv_text_);
  for (int v : {turns_evicted_, summaries_, summary_tok_count_}) w.i64(v);
  for (int v : {int(cache_now_.type), int(cache_now_.key_scale), cache_now_.residual, cache_now_.group_channels})
    w.i64(v);
  w.blob(seq_->save_state());
  return std::move(w.bytes());
}

void ChatSession::restore(const std::vector<uint8_t>& bytes) {
  ByteReader r(bytes);
  if (r.u32() != kSnapshotVersion) throw std::invalid_argument("session snapshot of another version");
  conv_.clear();
  conv_.set_system(r.str());
  conv_.set_summary(r.str());
  const uint32_t n = r.u32();
  for (uint32_t i = 0; i < n; ++i) {
    std::string u = r.str();
    conv_.add_turn(std::move(u), r.str());
  }
  std::string kv_text = r.str();
  turns_evicted_ = int(r.i64());
  summaries_ = int(r.i64());
  summary_tok_count_ = int(r.i64());
  KvCacheOptions c;
  c.type = KvType(r.i64());
  c.key_scale = KeyScale(r.i64());
  c.residual = int(r.i64());
  c.group_channels = int(r.i64());
  const std::vector<uint8_t> kv = r.blob();
  if (!r.done()) throw std::invalid_argument("session snapshot has trailing bytes");
  const std::optional<KvCacheOptions> keep = rebuild_cache_;
  rebuild_cache_ = c;
  rebuild();
  rebuild_cache_ = keep;
  seq_->load_state(kv);
  kv_text_ = std::move(kv_text);
}

}  // namespace kvs::chat
