#include "server/exchange.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "server/metrics_text.h"
#include "server/tenants.h"
#include "tokenizer/tokenizer.h"
#include "sched/clock.h"

namespace kvs::server {

using sched::FinishReason;
using sched::RejectReason;

HttpResponse error_response(const ApiError& e) {
  HttpResponse r;
  r.status = e.status;
  r.body = error_body(e);
  if (e.retry_after_s > 0)
    r.headers.emplace_back("Retry-After", std::to_string(int64_t(std::ceil(e.retry_after_s))));
  return r;
}

HttpResponse json_response(int status, const nlohmann::json& j) {
  HttpResponse r;
  r.status = status;
  r.body = dump(j);
  return r;
}

ApiError make_error(int status, const std::string& type, const std::string& code, const std::string& msg) {
  ApiError e;
  e.status = status;
  e.type = type;
  e.code = code;
  e.message = msg;
  return e;
}

ApiError unauthorized() {
  return make_error(401, "authentication_error", "invalid_api_key",
                    "missing or invalid API key (Authorization: Bearer <key>)");
}

ApiError engine_failure(const std::string& message) {
  ApiError e;
  e.status = 500;
  e.type = "server_error";
  e.code = "engine_error";
  e.message = message;
  return e;
}

ApiError reject_error(RejectReason r, const std::string& message, double retry_after_s, const std::string& param) {
  ApiError e;
  e.param = param;
  e.message = message.empty() ? std::string("request rejected: ") + sched::to_string(r) : message;
  e.code = sched::to_string(r);
  switch (r) {
    case RejectReason::ContextLength:
      e.status = 400;
      e.code = "context_length_exceeded";
      break;
    case RejectReason::Invalid:
      // As the codec's 400s (which catch these first when they can): code null.
      e.status = 400;
      e.code.clear();
      break;
    case RejectReason::RequestShare:
      e.status = 400;
      break;
    case RejectReason::ShuttingDown:
      e.status = 503;
      e.type = "service_unavailable";
      break;
    default:  // TenantQuota, QueueFull, QueueTimeout: try again later
      e.status = 429;
      e.type = "rate_limit_error";
      e.retry_after_s = retry_after_s > 0 ? retry_after_s : 1.0;
      break;
  }
  return e;
}

Exchange::Exchange(Setup s) : s_(std::move(s)), open_(s_.n * s_.prompts), t0_(sched::steady_now()) {
  queue_ = std::make_shared<EventQueue>(s_.queue_events, nullptr);
  prompts_.resize(size_t(s_.prompts));
  for (Prompt& p : prompts_) p.open = s_.n;
  choices_.resize(size_t(s_.n) * size_t(s_.prompts));
  for (size_t i = 0; i < choices_.size() && i / size_t(s_.n) < s_.echo.size(); ++i) {
    choices_[i].result.text = s_.echo[i / size_t(s_.n)];
    choices_[i].result.echo_bytes = choices_[i].result.text.size();
    choices_[i].offsets.echo = choices_[i].result.text;
  }
  if (s_.tool_format != ToolFormat::None)
    for (size_t i = 0; i < choices_.size(); ++i)
      choices_[i].tools = std::make_unique<ToolCallParser>(
          s_.tool_format, "call_" + s_.meta.id.substr(s_.meta.id.find_first_of("-_") + 1) + "_" + std::to_string(i) + "_");
  if (s_.endpoint == Endpoint::Responses && s_.stream) events_ = std::make_unique<ResponsesEvents>(s_.meta, *s_.responses);
}

sched::EventSink Exchange::sink_for(int prompt) const {
  std::shared_ptr<EventQueue> q = queue_;
  const int base = prompt * s_.n;
  return [q, base](sched::TokenEvent&& e) {
    e.choice += base;
    return q->push(std::move(e));
  };
}

Exchange::~Exchange() {
  queue_->set_wake(nullptr);  // the engine may still push a final event: nobody to wake
  cancel_open();              // blocks freed before the next step
  if (s_.quota_blocks > 0) s_.tenants->release(s_.tenant, s_.quota_blocks);
  if (!finished_ && final_status_ == 0) final_status_ = 499;  // client closed request (nginx's code)
  s_.counters->count_status(final_status_);
  // Tokens already queued but never polled still count in the log.
  for (const sched::TokenEvent& e : queue_->take())
    if (e.token >= 0 && e.choice >= 0 && size_t(e.choice) < choices_.size())
      ++prompts_[size_t(e.choice / s_.n)].tokens_seen;
  log_line();
}

void Exchange::cancel_open() {
  for (const Prompt& p : prompts_)
    if (p.open > 0 && p.id != 0) s_.loop->cancel(p.id);
}

sched::Usage Exchange::total_usage() const {
  sched::Usage u;
  for (const Prompt& p : prompts_) {
    u.prompt_tokens += p.usage.prompt_tokens;
    u.completion_tokens += p.usage.completion_tokens;
    u.cached_tokens += p.usage.cached_tokens;
    u.tier_tokens += p.usage.tier_tokens;
    u.tier_load_ms = std::max(u.tier_load_ms, p.usage.tier_load_ms);
  }
  return u;
}

void Exchange::log_line() {
  // Access log: ids, hashes and counts only, never text. A request that
  // ended early (client gone) has no final usage: its counts are what the
  // server saw.
  const sched::Usage u = total_usage();
  int completion = 0;
  for (const Prompt& p : prompts_) completion += std::max(p.usage.completion_tokens, p.tokens_seen);
  const double t = sched::steady_now();
  char tier[64] = "";
  if (u.tier_load_ms >= 0)
    std::snprintf(tier, sizeof tier, " tier_tokens=%d tier_load_ms=%.1f", u.tier_tokens, u.tier_load_ms);
  char handover[128] = "";
  if (handed_)
    std::snprintf(handover, sizeof handover, " handover_ms=%.1f kv_blocks_sent=%lld kv_blocks_skipped=%lld",
                  handed_->seconds * 1e3, static_cast<long long>(handed_->blocks),
                  static_cast<long long>(handed_->skipped_blocks));
  char buf[640];
  std::snprintf(buf, sizeof buf,
                "kvserve: request %s status=%d prompt_tokens=%d cached_tokens=%d%s completion_tokens=%d ttft_ms=%.1f "
                "e2e_ms=%.1f%s%s",
                s_.log_prefix.c_str(), final_status_, std::max(u.prompt_tokens, s_.prompt_tokens), u.cached_tokens,
                tier, completion, t_first_ >= 0 ? (t_first_ - t0_) * 1e3 : -1.0, (t - t0_) * 1e3,
                handover, gone_ ? " client_gone" : "");
  if (s_.log) {
    s_.log(buf);
  } else {
    std::fprintf(stderr, "%s\n", buf);
  }
}

void Exchange::client_gone() {
  if (finished_ || gone_) return;
  gone_ = true;
  cancel_open();
  s_.counters->client_disconnect();
}

void Exchange::parse_tools(Choice& c, sched::TokenEvent& e, ToolParse& out) {
  out = c.tools->push(e.text);
  if (e.finish != FinishReason::None) {
    ToolParse rest = c.tools->finish();
    out.content += rest.content;
    out.reasoning += rest.reasoning;
    out.calls.insert(out.calls.end(), rest.calls.begin(), rest.calls.end());
  }
  e.text = std::move(out.content);
  out.content.clear();
}

// A streamed completion or chat chunk for one event ("" when it adds none).
TokenText Exchange::token_text() const {
  return [this](int32_t id) { return s_.tok ? s_.tok->token_bytes(id, -1) : std::string(); };
}

std::string Exchange::chunk_of(Choice& c, sched::TokenEvent& e, const std::vector<LogprobEntry>& lps) {
  // Echo: the prompt text leads the choice's first chunk.
  const size_t pi = size_t(e.choice / s_.n);
  if (c.first && pi < s_.echo.size()) e.text = s_.echo[pi] + e.text;
  const TokenText tt = token_text();
  ChatExtras x;
  if (c.tools) {
    const int before = c.tools->calls();
    parse_tools(c, e, x.parsed);
    x.first_call = before;
    x.tool_finish = c.tools->calls() > 0;
  }
  nlohmann::json chunk =
      stream_chunk(s_.endpoint, s_.meta, e, c.first, s_.logprobs ? &lps : nullptr, tt, c.tools ? &x : nullptr,
                   &c.offsets);
  if (chunk.is_null()) return "";
  if (s_.include_usage) chunk["usage"] = chunk_usage();
  c.first = false;
  return sse_data(dump(chunk));
}

// One event into the whole response built at the end.
void Exchange::collect(Choice& c, sched::TokenEvent& e, const std::vector<LogprobEntry>& lps) {
  if (c.tools) {
    ToolParse x;
    parse_tools(c, e, x);
    c.result.reasoning += x.reasoning;
    c.result.tool_calls.insert(c.result.tool_calls.end(), x.calls.begin(), x.calls.end());
  }
  c.result.text += e.text;
  if (!e.prompt_logprobs.empty()) c.result.prompt_logprobs = std::move(e.prompt_logprobs);
  for (const LogprobEntry& t : lps) {
    c.result.logprobs.push_back(t.token);
    c.result.top_logprobs.push_back(t.top);
  }
}

bool Exchange::take_event(sched::TokenEvent& e, Output& out) {
  if (e.choice < 0 || size_t(e.choice) >= choices_.size()) return true;
  Choice& c = choices_[size_t(e.choice)];
  Prompt& p = prompts_[size_t(e.choice / s_.n)];
  if (c.done) return true;
  const bool final = e.finish != FinishReason::None;
  if (final) p.usage = e.usage;
  if (e.finish == FinishReason::HandedOff) handed_ = e.hand_off;
  if (e.token >= 0) ++p.tokens_seen;
  if (e.finish == FinishReason::Error) engine_error_ = e.message.empty() ? "engine error" : e.message;
  // Turned away (queue timeout, shutdown), or failed by the engine, before
  // anything was sent: a proper 429/503/500 instead of an empty or partial
  // 200; the other prompts' requests are cancelled with it.
  const bool refused = e.finish == FinishReason::Rejected && !started_;
  const bool failed = e.finish == FinishReason::Error && (!started_ || !s_.stream);
  if (refused || failed) {
    const ApiError err = failed ? engine_failure(engine_error_)
                                : reject_error(e.reject_reason, e.message, e.retry_after_s);
    out.full = error_response(err);
    final_status_ = err.status;
    c.done = true;
    --p.open;
    --open_;
    cancel_open();
    finished_ = true;
    out.done = true;
    return false;
  }
  if (e.token >= 0 && t_first_ < 0) t_first_ = sched::steady_now();
  if (events_) {
    if (c.first) out.data += events_->start();
    c.first = false;
    if (c.tools) {
      ToolParse x;
      parse_tools(c, e, x);
      c.result.tool_calls.insert(c.result.tool_calls.end(), x.calls.begin(), x.calls.end());
    }
    out.data += events_->delta(e.text);
    c.result.text += e.text;
  } else {
    // Before echo and tool parsing change e.text: the engine's own text.
    std::vector<LogprobEntry> lps;
    if (s_.logprobs) lps = c.held.take(e, token_text());
    if (s_.stream) out.data += chunk_of(c, e, lps);
    else collect(c, e, lps);
  }
  if (final) {
    c.done = true;
    c.result.finish = e.finish;
    --p.open;
    --open_;
  }
  return true;
}

// OpenAI: with include_usage every chunk has "usage", null but in the last.
// vLLM's continuous_usage_stats: the whole request's counts so far (a
// prompt's cached tokens are known once one of its choices has finished).
nlohmann::json Exchange::chunk_usage() const {
  if (!s_.continuous_usage) return nullptr;
  sched::Usage u = total_usage();
  u.prompt_tokens = std::max(u.prompt_tokens, s_.prompt_tokens);
  u.completion_tokens = 0;
  for (const Prompt& p : prompts_) u.completion_tokens += p.tokens_seen;
  return usage_json(u);
}

void Exchange::finish(Output& out) {
  finished_ = true;
  out.done = true;
  const sched::Usage usage = total_usage();
  if (s_.endpoint == Endpoint::Responses) return finish_response(out, usage);
  if (s_.stream) {
    if (s_.include_usage) out.data += sse_data(dump(usage_chunk(s_.endpoint, s_.meta, usage)));
    // A stream the engine failed part-way: its choice ended with
    // finish_reason "error"; the error object says why before [DONE].
    if (!engine_error_.empty()) out.data += sse_data(error_body(engine_failure(engine_error_)));
    out.data += sse_done();
    return;
  }
  if (handed_) {
    // What the router passes to the decode worker (?kv_handover=...).
    HttpResponse r;
    r.body = dump(nlohmann::json{{"object", "kv.handover"},
                                 {"id", s_.meta.id},
                                 {"handle", handed_->handle},
                                 {"first_token", handed_->first_token},
                                 {"draws", handed_->draws},
                                 {"seed", s_.seed},
                                 {"blocks", handed_->blocks},
                                 {"skipped_blocks", handed_->skipped_blocks},
                                 {"bytes", handed_->bytes},
                                 {"seconds", handed_->seconds},
                                 {"usage", {{"prompt_tokens", usage.prompt_tokens}, {"cached_tokens", usage.cached_tokens}}}});
    out.full = std::move(r);
    final_status_ = 200;
    return;
  }
  std::vector<ChoiceResult> res;
  for (Choice& c : choices_) res.push_back(std::move(c.result));
  const TokenText tt = [this](int32_t id) { return s_.tok ? s_.tok->token_bytes(id, -1) : std::string(); };
  HttpResponse r;
  r.body = dump(completion_response(s_.endpoint, s_.meta, res, usage, s_.logprobs, tt));
  out.full = std::move(r);
  final_status_ = 200;
}

// /v1/responses: the object, or the stream's closing events (no [DONE]);
// the object and its text are kept for previous_response_id and GET.
void Exchange::finish_response(Output& out, const sched::Usage& usage) {
  const Choice& c = choices_.at(0);
  if (events_) {
    if (c.first) out.data += events_->start();  // nothing was generated
    if (!engine_error_.empty()) {
      const ApiError e = engine_failure(engine_error_);
      out.data += "event: error\ndata: " +
                  dump(nlohmann::json{{"type", "error"}, {"code", e.code}, {"message", e.message}, {"param", nullptr}}) +
                  "\n\n";
    }
    out.data += events_->finish(c.result.finish, usage, c.result.tool_calls);
  }
  const nlohmann::json obj = response_object(s_.meta, *s_.responses, c.result.text, c.result.tool_calls,
                                             c.result.finish, usage);
  if (!events_) {
    HttpResponse r;
    r.body = dump(obj);
    out.full = std::move(r);
    final_status_ = 200;
  }
  if (s_.on_done && engine_error_.empty()) s_.on_done(obj, c.result.text, c.result.tool_calls);
}

Exchange::Output Exchange::poll() {
  Output out;
  if (finished_) return out;
  std::vector<sched::TokenEvent> events = queue_->take();
  for (sched::TokenEvent& e : events)
    if (!take_event(e, out)) return out;
  if (open_ == 0) finish(out);
  if (s_.stream && !started_ && (!out.data.empty() || out.done)) {
    started_ = true;
    out.start_stream = true;
    final_status_ = 200;
  }
  if (queue_->overflowed() && !finished_) out.cut_off = true;
  return out;
}

}  // namespace kvs::server
