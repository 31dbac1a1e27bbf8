// /metrics text: the model-server protocol names (vllm:*) that gateways and
// dashboards read, beside the kvserve_ names. The exposition is parsed line by
// line as a Prometheus scraper would: every sample belongs to a family with a
// TYPE line, names and types are vLLM's, values come from the snapshot.
#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>

#include "server/metrics_text.h"

using namespace kvs;
using namespace kvs::server;

namespace {

struct Parsed {
  std::map<std::string, std::string> type;     // family -> counter | gauge | histogram
  std::map<std::string, double> sample;        // "name{labels}" -> value
  std::map<std::string, std::string> family_of;  // sample -> family
};

// The family a sample line belongs to: its name, less a histogram suffix.
std::string family(const std::string& name, const std::map<std::string, std::string>& types) {
  if (types.count(name)) return name;
  for (const char* suf : {"_bucket", "_sum", "_count"}) {
    const std::string s(suf);
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      const std::string base = name.substr(0, name.size() - s.size());
      if (types.count(base)) return base;
    }
  }
  return "";
}

Parsed parse(const std::string& text) {
  Parsed p;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream l(line.substr(7));
      std::string name, type;
      l >> name >> type;
      EXPECT_EQ(p.type.count(name), 0u) << "family typed twice: " << name;
      p.type[name] = type;
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    const std::string key = line.substr(0, sp);
    const std::string name = key.substr(0, key.find('{'));
    const std::string fam = family(name, p.type);
    EXPECT_FALSE(fam.empty()) << "sample without a TYPE line: " << line;
    p.family_of[key] = fam;
    p.sample[key] = std::stod(line.substr(sp + 1));
  }
  return p;
}

sched::MetricsSnapshot snapshot() {
  sched::MetricsSnapshot m;
  m.running_requests = 3;
  m.queued = {2, 5};
  m.kv_blocks_total = 200;
  m.kv_blocks_used = 50;
  m.kv_blocks_free = 100;
  m.kv_blocks_cached = 50;
  m.prefix_query_tokens = 1000;
  m.prefix_hit_tokens = 640;
  m.ttft = sched::Histogram::latency();
  m.ttft.observe(0.004);
  m.ttft.observe(0.2);
  m.ttft.observe(0.3);
  return m;
}

}  // namespace

TEST(MetricsText, VllmNamesTypesAndValues) {
  const Parsed p = parse(render_metrics(snapshot(), {}, {true, "stories \"260K\""}));
  const std::string sel = "{model_name=\"stories \\\"260K\\\"\",engine=\"0\"}";
  EXPECT_EQ(p.type.at("vllm:num_requests_running"), "gauge");
  EXPECT_EQ(p.type.at("vllm:num_requests_waiting"), "gauge");
  EXPECT_EQ(p.type.at("vllm:kv_cache_usage_perc"), "gauge");
  EXPECT_EQ(p.type.at("vllm:prefix_cache_queries_total"), "counter");
  EXPECT_EQ(p.type.at("vllm:prefix_cache_hits_total"), "counter");
  EXPECT_EQ(p.type.at("vllm:time_to_first_token_seconds"), "histogram");
  EXPECT_EQ(p.sample.at("vllm:num_requests_running" + sel), 3);
  EXPECT_EQ(p.sample.at("vllm:num_requests_waiting" + sel), 7);
  EXPECT_DOUBLE_EQ(p.sample.at("vllm:kv_cache_usage_perc" + sel), 0.25);
  EXPECT_EQ(p.sample.at("vllm:prefix_cache_queries_total" + sel), 1000);
  EXPECT_EQ(p.sample.at("vllm:prefix_cache_hits_total" + sel), 640);
  EXPECT_EQ(p.sample.at("vllm:time_to_first_token_seconds_count" + sel), 3);
  EXPECT_NEAR(p.sample.at("vllm:time_to_first_token_seconds_sum" + sel), 0.504, 1e-12);
  EXPECT_EQ(p.sample.at("vllm:time_to_first_token_seconds_bucket{model_name=\"stories \\\"260K\\\"\",engine=\"0\","
                        "le=\"+Inf\"}"),
            3);
  // Buckets are cumulative: none above the count, the 1 s bucket holds all.
  int buckets = 0;
  for (const auto& [k, v] : p.sample) {
    if (k.rfind("vllm:time_to_first_token_seconds_bucket", 0) != 0) continue;
    ++buckets;
    EXPECT_LE(v, 3);
  }
  EXPECT_GT(buckets, 5);
  EXPECT_EQ(p.sample.at("vllm:time_to_first_token_seconds_bucket{model_name=\"stories \\\"260K\\\"\",engine=\"0\","
                        "le=\"1\"}"),
            3);
  // The kvserve_ names are still there, with the same values.
  EXPECT_EQ(p.sample.at("kvserve_prefix_cache_hits_tokens_total"), 640);
  EXPECT_DOUBLE_EQ(p.sample.at("kvserve_kv_usage_ratio"), 0.25);
}

TEST(MetricsText, CompatNoneHasNoVllmNames) {
  const std::string text = render_metrics(snapshot(), {}, {false, "m"});
  EXPECT_EQ(text.find("vllm:"), std::string::npos);
  EXPECT_NE(text.find("kvserve_running_requests 3"), std::string::npos);
}

TEST(MetricsText, EmptyPoolReportsZeroUsage) {
  sched::MetricsSnapshot m;
  const Parsed p = parse(render_vllm_metrics(m, "m"));
  EXPECT_EQ(p.sample.at("vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"0\"}"), 0);
  EXPECT_EQ(p.sample.at("vllm:time_to_first_token_seconds_count{model_name=\"m\",engine=\"0\"}"), 0);
}

// The hybrid cache: blocks and bytes per KV table, labelled with its
// window; one table prints none of these (the text as it was).
TEST(MetricsText, HybridCacheCountsEachTable) {
  sched::MetricsSnapshot m = snapshot();
  EXPECT_EQ(render_metrics(m, {}, {false, "m"}).find("kv_table_"), std::string::npos);
  m.kv_block_bytes = 4096;
  m.kv_table_windows = {0, 1024};
  m.kv_table_blocks = {40, 10};
  const Parsed p = parse(render_metrics(m, {}, {false, "m"}));
  EXPECT_EQ(p.type.at("kvserve_kv_table_used_blocks"), "gauge");
  EXPECT_EQ(p.sample.at("kvserve_kv_table_used_blocks{table=\"0\",window=\"0\"}"), 40);
  EXPECT_EQ(p.sample.at("kvserve_kv_table_used_blocks{table=\"1\",window=\"1024\"}"), 10);
  EXPECT_EQ(p.sample.at("kvserve_kv_table_used_bytes{table=\"1\",window=\"1024\"}"), 10 * 4096);
}
