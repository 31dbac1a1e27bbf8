#include "server/exchange.h"

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

ApiError engine_failure(const std::string& message) {
  ApiError e;
  e.status = 500;
  e.type = "server_error";
  e.code = "engine_error";
  e.message = message;
  return e;
}

ApiError reject_error(RejectReason r, const std::string& message, double retry_after_s) {
  ApiError e;
  e.message = message.empty() ? std::string("request rejected: ") + sched::to_string(r) : message;
  e.code = sched::to_string(r);
  switch (r) {
    case RejectReason::ContextLength:
      e.status = 400;
      e.code = "context_length_exceeded";
      break;
    case RejectReason::Invalid:
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

Exchange::Exchange(Setup s) : s_(std::move(s)), open_(s_.n), t0_(sched::steady_now()) {
  queue_ = std::make_shared<EventQueue>(s_.queue_events, nullptr);
  choices_.resize(size_t(s_.n));
}

Exchange::~Exchange() {
  queue_->set_wake(nullptr);  // the engine may still push a final event: nobody to wake
  if (!finished_ && id_ != 0) s_.loop->cancel(id_);  // blocks freed before the next step
  if (s_.quota_blocks > 0) s_.tenants->release(s_.tenant, s_.quota_blocks);
  if (!finished_ && final_status_ == 0) final_status_ = 499;  // client closed request (nginx's code)
  s_.counters->count_status(final_status_);
  // Access log: ids, hashes and counts only, never text.
  const double t = sched::steady_now();
  std::fprintf(stderr,
               "kvserve: request %s status=%d prompt_tokens=%d cached_tokens=%d completion_tokens=%d ttft_ms=%.1f "
               "e2e_ms=%.1f%s\n",
               s_.log_prefix.c_str(), final_status_, usage_.prompt_tokens, usage_.cached_tokens,
               usage_.completion_tokens, t_first_ >= 0 ? (t_first_ - t0_) * 1e3 : -1.0, (t - t0_) * 1e3,
               gone_ ? " client_gone" : "");
}

void Exchange::client_gone() {
  if (finished_ || gone_) return;
  gone_ = true;
  if (id_ != 0) s_.loop->cancel(id_);
  s_.counters->client_disconnect();
}

Exchange::Output Exchange::poll() {
  Output out;
  if (finished_) return out;
  std::vector<sched::TokenEvent> events = queue_->take();
  const TokenText tt = [this](int32_t id) { return s_.tok ? s_.tok->token_bytes(id, -1) : std::string(); };
  for (sched::TokenEvent& e : events) {
    if (e.choice < 0 || size_t(e.choice) >= choices_.size()) continue;
    Choice& c = choices_[size_t(e.choice)];
    if (c.done) continue;
    const bool final = e.finish != FinishReason::None;
    if (final) usage_ = e.usage;
    // Turned away before anything was sent (queue timeout, shutdown): the
    // client gets a proper 429/503 instead of an empty 200 stream.
    if (e.finish == FinishReason::Error) engine_error_ = e.message.empty() ? "engine error" : e.message;
    // The engine failed before anything was sent: a 500, not a 200 with an
    // empty or partial body.
    if (e.finish == FinishReason::Error && (!started_ || !s_.stream)) {
      out.full = error_response(engine_failure(engine_error_));
      final_status_ = 500;
      finished_ = true;
      out.done = true;
      return out;
    }
    if (e.finish == FinishReason::Rejected && !started_) {
      const ApiError err = reject_error(e.reject_reason, e.message, e.retry_after_s);
      out.full = error_response(err);
      final_status_ = err.status;
      finished_ = true;
      out.done = true;
      return out;
    }
    if (e.token >= 0 && t_first_ < 0) t_first_ = sched::steady_now();
    if (s_.stream) {
      const nlohmann::json chunk = stream_chunk(s_.endpoint, s_.meta, e, c.first, s_.logprobs, tt);
      if (!chunk.is_null()) {
        out.data += sse_data(dump(chunk));
        c.first = false;
      }
    } else {
      c.result.text += e.text;
      if (s_.logprobs && e.logprob) {
        c.result.logprobs.push_back(*e.logprob);
        c.result.top_logprobs.push_back(e.top_logprobs);
      }
    }
    if (final) {
      c.done = true;
      c.result.finish = e.finish;
      --open_;
    }
  }
  if (open_ == 0) {
    finished_ = true;
    out.done = true;
    if (s_.stream) {
      if (s_.include_usage) out.data += sse_data(dump(usage_chunk(s_.endpoint, s_.meta, usage_)));
      // A stream the engine failed part-way: its choice ended with
      // finish_reason "error"; the error object says why before [DONE].
      if (!engine_error_.empty()) out.data += sse_data(error_body(engine_failure(engine_error_)));
      out.data += sse_done();
    } else {
      std::vector<ChoiceResult> res;
      for (Choice& c : choices_) res.push_back(std::move(c.result));
      HttpResponse r;
      r.body = dump(completion_response(s_.endpoint, s_.meta, res, usage_, s_.logprobs, tt));
      out.full = std::move(r);
      final_status_ = 200;
    }
  }
  if (s_.stream && !started_ && (!out.data.empty() || out.done)) {
    started_ = true;
    out.start_stream = true;
    final_status_ = 200;
  }
  if (queue_->overflowed() && !finished_) out.cut_off = true;
  return out;
}

}  // namespace kvs::server
