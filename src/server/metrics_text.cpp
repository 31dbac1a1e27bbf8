#include "server/metrics_text.h"

#include <cstdio>

namespace kvs::server {

void ServerCounters::count_status(int st) {
  std::lock_guard lk(mu_);
  ++s_.status[st];
}
void ServerCounters::count_reject(const std::string& r) {
  std::lock_guard lk(mu_);
  ++s_.rejects[r];
}
void ServerCounters::stream_opened() {
  std::lock_guard lk(mu_);
  ++s_.open_streams;
}
void ServerCounters::stream_closed() {
  std::lock_guard lk(mu_);
  --s_.open_streams;
}
void ServerCounters::client_disconnect() {
  std::lock_guard lk(mu_);
  ++s_.disconnects;
}
ServerCounters::Snapshot ServerCounters::snapshot() const {
  std::lock_guard lk(mu_);
  return s_;
}

namespace {

struct Out {
  std::string prefix = "kvserve_";
  std::string s;
  void head(const char* name, const char* type, const char* help) {
    s += "# HELP " + prefix + name + ' ' + help + "\n# TYPE " + prefix + name + ' ' + type + '\n';
  }
  void val(const std::string& name_labels, double v) {
    char b[64];
    // %.17g round-trips doubles; integers print without a fraction.
    std::snprintf(b, sizeof b, "%.17g", v);
    s += prefix + name_labels + ' ' + b + '\n';
  }
  void gauge(const char* name, const char* help, double v) {
    head(name, "gauge", help);
    val(name, v);
  }
  void counter(const char* name, const char* help, double v) {
    head(name, "counter", help);
    val(name, v);
  }
  // `labels`: "" or `k="v",` pairs each followed by a comma, put before le.
  void histogram(const char* name, const char* help, const sched::Histogram& h, const std::string& labels = "") {
    head(name, "histogram", help);
    uint64_t acc = 0;
    char le[64];
    const std::string n(name);
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      acc += i < h.counts.size() ? h.counts[i] : 0;
      std::snprintf(le, sizeof le, "%g", h.bounds[i]);
      val(n + "_bucket{" + labels + "le=\"" + le + "\"}", double(acc));
    }
    val(n + "_bucket{" + labels + "le=\"+Inf\"}", double(h.count));
    const std::string plain = labels.empty() ? "" : "{" + labels.substr(0, labels.size() - 1) + "}";
    val(n + "_sum" + plain, h.sum);
    val(n + "_count" + plain, double(h.count));
  }
};

// A Prometheus label value: backslash, quote and newline escaped.
std::string label_value(const std::string& v) {
  std::string o;
  for (char c : v) {
    if (c == '\\' || c == '"') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}

}  // namespace

std::string render_vllm_metrics(const sched::MetricsSnapshot& m, const std::string& model_name) {
  // Names, types and units as vLLM's Prometheus logger exposes them (counters
  // carry _total, as prometheus_client writes them); one engine, index 0.
  Out o;
  o.prefix = "vllm:";
  const std::string lab = "model_name=\"" + label_value(model_name) + "\",engine=\"0\"";
  const std::string sel = "{" + lab + "}";
  o.head("num_requests_running", "gauge", "Number of requests in model execution batches.");
  o.val("num_requests_running" + sel, m.running_requests);
  o.head("num_requests_waiting", "gauge", "Number of requests waiting to be processed.");
  int waiting = 0;
  for (int q : m.queued) waiting += q;
  o.val("num_requests_waiting" + sel, waiting);
  o.head("kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.");
  o.val("kv_cache_usage_perc" + sel,
        m.kv_blocks_total > 0 ? double(m.kv_blocks_used) / double(m.kv_blocks_total) : 0.0);
  o.head("prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.");
  o.val("prefix_cache_queries_total" + sel, double(m.prefix_query_tokens));
  o.head("prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.");
  o.val("prefix_cache_hits_total" + sel, double(m.prefix_hit_tokens));
  o.histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.", m.ttft, lab + ",");
  return o.s;
}

std::string render_metrics(const sched::MetricsSnapshot& m, const ServerCounters::Snapshot& c,
                           const MetricsCompat& compat) {
  Out o;
  o.head("requests_total", "counter", "Completion requests by final HTTP status.");
  for (const auto& [st, n] : c.status) o.val("requests_total{status=\"" + std::to_string(st) + "\"}", double(n));
  if (c.status.empty()) o.val("requests_total{status=\"200\"}", 0);

  // Rejections: the engine loop's (admission) and the server's own (auth,
  // per-tenant quota, oversized body, ...) under one name.
  o.head("requests_rejected_total", "counter", "Requests refused, by reason.");
  std::map<std::string, int64_t> rej = c.rejects;
  for (int r = 1; r < sched::kNumRejectReasons; ++r)
    rej[sched::to_string(sched::RejectReason(r))] += m.rejections[size_t(r)];
  for (const auto& [reason, n] : rej) o.val("requests_rejected_total{reason=\"" + reason + "\"}", double(n));

  o.gauge("running_requests", "Requests with at least one running sequence.", m.running_requests);
  o.gauge("running_sequences", "Sequences (choices) running.", m.running_seqs);
  o.head("queue_depth", "gauge", "Requests waiting for admission, by SLO class.");
  for (int k = 0; k < sched::kNumSloClasses; ++k)
    o.val(std::string("queue_depth{class=\"") + sched::to_string(sched::SloClass(k)) + "\"}", m.queued[size_t(k)]);
  o.gauge("open_streams", "SSE responses being written.", double(c.open_streams));
  o.counter("client_disconnects_total", "Requests aborted because the client went away or stopped reading.",
            double(c.disconnects));

  o.gauge("kv_blocks_total", "KV blocks in the pool.", double(m.kv_blocks_total));
  o.gauge("kv_blocks_free", "KV blocks holding nothing.", double(m.kv_blocks_free));
  o.gauge("kv_blocks_cached", "KV blocks held only by the prefix cache (reusable, evictable).",
          double(m.kv_blocks_cached));
  o.gauge("kv_blocks_used", "KV blocks held by running sequences.", double(m.kv_blocks_used));
  o.gauge("kv_usage_ratio", "Used blocks / total blocks.",
          m.kv_blocks_total > 0 ? double(m.kv_blocks_used) / double(m.kv_blocks_total) : 0.0);
  o.gauge("kv_block_size_tokens", "Token slots per KV block.", m.block_size);
  if (m.kv_table_blocks.size() > 1) {
    // The hybrid cache: what each KV table (a group of layers with one
    // window, 0 = the whole context) holds.
    o.head("kv_table_used_blocks", "gauge", "KV blocks held by running sequences, per KV table.");
    for (size_t t = 0; t < m.kv_table_blocks.size(); ++t)
      o.val("kv_table_used_blocks{table=\"" + std::to_string(t) + "\",window=\"" +
                std::to_string(m.kv_table_windows[t]) + "\"}",
            double(m.kv_table_blocks[t]));
    o.head("kv_table_used_bytes", "gauge", "Bytes of the KV blocks held by running sequences, per KV table.");
    for (size_t t = 0; t < m.kv_table_blocks.size(); ++t)
      o.val("kv_table_used_bytes{table=\"" + std::to_string(t) + "\",window=\"" +
                std::to_string(m.kv_table_windows[t]) + "\"}",
            double(m.kv_table_blocks[t]) * double(m.kv_block_bytes));
  }
  o.counter("prefix_cache_queries_tokens_total", "Prompt tokens looked up in the prefix cache.",
            double(m.prefix_query_tokens));
  o.counter("prefix_cache_hits_tokens_total", "Prompt tokens whose K/V came from the prefix cache.",
            double(m.prefix_hit_tokens));
  o.head("prefix_cache_dropped_blocks_total", "counter",
         "Cached KV blocks dropped before eviction: a tenant revoke, its retention TTL, or device shedding.");
  o.val("prefix_cache_dropped_blocks_total{reason=\"revoke\"}", double(m.prefix_dropped_revoke));
  o.val("prefix_cache_dropped_blocks_total{reason=\"retention\"}", double(m.prefix_dropped_retention));
  o.val("prefix_cache_dropped_blocks_total{reason=\"device\"}", double(m.prefix_dropped_device));
  o.counter("preemptions_total", "Requests preempted to free KV blocks.", double(m.preemptions));
  o.counter("requests_failed_total", "Requests ended by an engine error (finish_reason error).",
            double(m.requests_failed));
  o.counter("prefix_waits_total",
            "Admission steps deferred because another request was computing the same prompt prefix.",
            double(m.prefix_waits));
  o.counter("prompt_tokens_total", "Prompt tokens of admitted requests.", double(m.prompt_tokens));
  o.counter("prefill_tokens_total", "Prompt (and recomputed) tokens that went through the model.",
            double(m.prefill_tokens));
  o.counter("generation_tokens_total", "Generated tokens.", double(m.generated_tokens));
  o.counter("engine_steps_total", "Engine steps (forward passes).", double(m.steps));
  o.histogram("time_to_first_token_seconds", "Submit to first token.", m.ttft);
  o.histogram("time_per_output_token_seconds", "Mean gap between later tokens, per choice.", m.tpot);
  o.histogram("e2e_request_latency_seconds", "Submit to last token.", m.e2e);
  if (compat.vllm) o.s += render_vllm_metrics(m, compat.model_name);
  return o.s;
}

}  // namespace kvs::server
