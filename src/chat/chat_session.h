// One interactive conversation on the model: its own LocalSequence (private
// KV blocks), the chat template, streaming replies, and a bounded KV.
//
// Two ways to stay inside the hard cap (ChatOptions::summary):
//   rolling summary  before a turn would push the KV past the hard cap, the
//                    oldest whole turns leave; the model first condenses them,
//                    with the previous summary, into a new summary of at most
//                    summary_tokens tokens (greedy). The sequence is then
//                    rebuilt once: system prompt + summary + kept turns are
//                    re-prefilled. The KV never holds more than the hard cap,
//                    so its block count is fixed for the whole conversation.
//   sliding window   (summary off) the sequence runs under a streaming window
//                    with attention sinks (kv/window_policy.h): old tokens
//                    simply fall out of view, as `generate` does.
// Between rebuilds the KV grows by appending: each turn prefills only the
// text that render() added since the last reply.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "chat/conversation.h"
#include "engine/kv_cache.h"
#include "engine/latency_samples.h"
#include "engine/local_sequence.h"
#include "engine/sampler.h"
#include "kv/window_policy.h"
#include "kvserve/engine.h"
#include "tokenizer/tokenizer.h"

namespace kvs::chat {

struct ChatOptions {
  std::string system = "You are a helpful assistant.";
  int hard_cap = 0;         // most tokens the KV holds; 0 = the model's trained context
  int window = 0;           // summary mode: tokens kept after an eviction at most; 0 = half the hard cap
  int max_tokens = 256;     // per reply
  bool summary = true;      // rolling summary; false: sliding window
  int summary_tokens = 0;   // budget of one summary; 0 = a quarter of the window, capped
  int sinks = 4;            // sliding window: attention sinks
  int block_size = 16;
  SamplingParams sampling;
  KvCacheOptions cache;
};

struct ReplyResult {
  std::string text;
  std::string finish_reason;  // "stop", "length", "cancelled"
  int prompt_tokens = 0;      // prefilled for this turn (all of it after a rebuild)
  int tokens = 0;             // generated
  double ttft_s = 0;          // prefill and first token
  bool rebuilt = false;       // the sequence was re-prefilled (eviction, template drift)
  std::string notice;         // what this turn had to give up to fit the cap (summary cut, fresh start); empty: nothing
};

struct ChatStats {
  int64_t kv_bytes = 0;       // live blocks × block bytes
  int live_blocks = 0, peak_blocks = 0, capacity_blocks = 0;
  int n_past = 0;             // tokens in the KV now
  int hard_cap = 0, window = 0, max_tokens = 0;
  bool summary_mode = true;
  std::string summary;
  int summary_tokens = 0;
  int turns_kept = 0, turns_evicted = 0, summaries = 0;
  double tpot_p50_s = 0, tpot_p99_s = 0;
  size_t tpot_samples = 0;
  std::string kv_desc, window_desc;
  double last_ttft_s = 0;      // of the latest reply (after a resume: with the KV restored)
  int last_prompt_tokens = 0;  // prefilled for it
};

class ChatSession {
 public:
  // Throws std::invalid_argument on inconsistent options (window >= hard cap,
  // no room for a reply, ...).
  ChatSession(Engine& engine, const Tokenizer& tok, server::ChatTemplate tmpl, ChatOptions opts);

  // Runs one turn. on_text receives reply text as it becomes final; return
  // false to stop the reply early. Throws std::length_error when the message
  // cannot fit the hard cap even with every earlier turn evicted; the
  // conversation is then left as it was. Anything else that must give way to
  // the cap (the summary cut, turns dropped, a fresh start) is a notice.
  ReplyResult reply(const std::string& user, const std::function<bool(const std::string&)>& on_text = nullptr);
  void reset();  // forgets every turn and the summary; KV emptied
  ChatStats stats() const;
  const Conversation& conversation() const { return conv_; }

  // Device shedding: replies are cut to at most `n` tokens (0 = no cap).
  void set_max_tokens_cap(int n) { max_tokens_cap_ = n; }
  // Receives each notice as it happens (also in ReplyResult::notice), e.g. to
  // print it before the reply streams.
  void set_notice_sink(std::function<void(const std::string&)> f) { notice_sink_ = std::move(f); }
  // Device shedding: the KV format the sequence takes at its next rebuild
  // (reset or eviction); nullopt = the configured one.
  void set_rebuild_cache(std::optional<KvCacheOptions> c) { rebuild_cache_ = std::move(c); }
  // Everything a resumed chat needs (turns, summary, the KV itself) as
  // bytes, and back; restore throws std::invalid_argument on malformed bytes
  // or a KV that does not fit this session. Encrypted by session_store.
  std::vector<uint8_t> snapshot() const;
  void restore(const std::vector<uint8_t>& bytes);

  // Device shedding: this share of the engine's compute threads runs the
  // forwards (1 = all).
  void set_thread_share(double share);

 private:
  Engine& engine_;
  const Tokenizer& tok_;
  ChatOptions o_;
  Conversation conv_;
  KvCacheOptions cache_now_;
  std::unique_ptr<LocalSequence> seq_;
  std::string kv_text_;  // text whose tokens the KV holds, in order
  LatencySamples tpot_;
  int max_tokens_cap_ = 0;
  std::optional<KvCacheOptions> rebuild_cache_;
  int turns_evicted_ = 0, summaries_ = 0, summary_tok_count_ = 0;
  double last_ttft_s_ = 0;
  int last_prompt_tokens_ = 0;
  std::function<void(const std::string&)> notice_sink_;
  std::string notice_;  // of the turn in progress

  int reply_budget() const;
  void rebuild();  // new empty sequence (new KV format if shedding asked for one)
  int count_tokens(const std::string& text) const;
  std::vector<int32_t> prompt_tokens(const std::string& user, bool& rebuilt);
  // At most the first n tokens of text (whole tokens, whitespace trimmed).
  std::string cut_tokens(const std::string& text, int n) const;
  void note(const std::string& what);
  void make_room(const std::string& user);
  // Shrinks the conversation until the prompt for `user` plus a reply fits the cap.
  void fit_cap(const std::string& user);
  std::string summarize(const std::vector<Turn>& evicted);
  // Decodes after `logits`; appends the raw text of every generated token to kv_text_.
  void decode(std::vector<float> logits, int budget, const std::function<bool(const std::string&)>& on_text,
              ReplyResult& r);
};

}  // namespace kvs::chat
