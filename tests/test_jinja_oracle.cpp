// The oracle test: every chat template in ../shared/chat-templates rendered
// on a set of conversations (tests/jinja/chat_cases.json) by the reference
// Jinja2, set up as Hugging Face transformers sets it up
// (tests/jinja/jinja_oracle.py, one Python process for all of them), and
// by kvserve's engine. The texts must be equal byte for byte, or both
// sides must fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "jinja/template.h"
#include "server/chat_template.h"
#include "test_util.h"
#include "tokenizer/vocab.h"

namespace {

using nlohmann::ordered_json;
namespace fs = std::filesystem;

// The fixed date both sides' strftime_now use.
constexpr int kNow[6] = {2026, 1, 15, 10, 30, 0};

std::tm fixed_now() {
  std::tm t{};
  t.tm_year = kNow[0] - 1900;
  t.tm_mon = kNow[1] - 1;
  t.tm_mday = kNow[2];
  t.tm_hour = kNow[3];
  t.tm_min = kNow[4];
  t.tm_sec = kNow[5];
  const time_t secs = timegm(&t);
  gmtime_r(&secs, &t);  // fills the weekday and day of the year
  return t;
}

std::string where_differs(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  auto around = [&](const std::string& s) {
    return ordered_json(s.substr(i < 40 ? 0 : i - 40, 120)).dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  };
  return "first difference at byte " + std::to_string(i) + " (lengths " + std::to_string(want.size()) + " and " +
         std::to_string(got.size()) + ")\n  jinja2: " + around(want) + "\n  kvserve: " + around(got);
}

struct Oracle {
  std::vector<std::pair<std::string, std::string>> templates;  // name, path
  ordered_json cases;
  ordered_json results;
};

ordered_json chat_cases() {
  return ordered_json::parse(kvs::test::read_file(std::string(KVS_SOURCE_DIR) + "/tests/jinja/chat_cases.json"))["cases"];
}

// Jinja2's renderings of `cases` (default: tests/jinja/chat_cases.json) with every template.
Oracle run_oracle(const ordered_json& cases = chat_cases(), const std::tm& now = fixed_now()) {
  Oracle o;
  const fs::path dir = kvs::test::shared("chat-templates");
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".jinja") o.templates.emplace_back(e.path().stem().string(), e.path().string());
  std::sort(o.templates.begin(), o.templates.end());
  o.cases = cases;
  ordered_json req = {{"templates", ordered_json::array()}, {"cases", o.cases}, {"now", ordered_json::array()}};
  for (const auto& [name, path] : o.templates) req["templates"].push_back({{"name", name}, {"path", path}});
  for (int x : {now.tm_year + 1900, now.tm_mon + 1, now.tm_mday, now.tm_hour, now.tm_min, now.tm_sec})
    req["now"].push_back(x);
  const std::string tmp = kvs::test::temp_dir();
  std::ofstream(tmp + "/request.json") << req.dump();
  const std::string cmd = "python3 " + std::string(KVS_SOURCE_DIR) + "/tests/jinja/jinja_oracle.py < " + tmp +
                          "/request.json > " + tmp + "/answer.json 2> " + tmp + "/stderr.txt";
  const int rc = std::system(cmd.c_str());
  if (rc != 0)
    throw std::runtime_error("the Jinja2 oracle failed (is python3-jinja2 installed? scripts/deps.sh): " +
                             kvs::test::read_file(tmp + "/stderr.txt"));
  o.results = ordered_json::parse(kvs::test::read_file(tmp + "/answer.json"));
  return o;
}

}  // namespace

TEST(JinjaOracle, EveryTemplateRendersAsJinja2) {
  const Oracle o = run_oracle();
  ASSERT_EQ(o.templates.size(), 40u) << "expected the 40 templates of ../shared/chat-templates";
  std::printf("reference: Jinja2 %s\n", o.results["jinja2"].get<std::string>().c_str());
  kvs::jinja::RenderOptions opt;
  opt.clock = fixed_now;
  int total = 0, matched = 0, rendered = 0;
  for (const auto& [name, path] : o.templates) {
    const ordered_json& want_all = o.results["results"][name];
    std::unique_ptr<kvs::jinja::Template> tmpl;
    std::string parse_error;
    try {
      tmpl = std::make_unique<kvs::jinja::Template>(kvs::test::read_file(path), name);
    } catch (const kvs::jinja::Error& e) {
      parse_error = e.what();
    }
    int ok = 0, n = 0, texts = 0;
    for (const ordered_json& c : o.cases) {
      const std::string cname = c["name"].get<std::string>();
      const ordered_json& want = want_all[cname];
      ++n;
      std::string got, error = parse_error;
      if (tmpl) {
        try {
          got = tmpl->render(c["vars"], opt);
        } catch (const kvs::jinja::Error& e) {
          error = e.what();
        }
      }
      const bool want_ok = want["ok"].get<bool>();
      if (want_ok && error.empty() && got == want["text"].get<std::string>()) {
        ++ok;
        ++texts;
      } else if (!want_ok && !error.empty()) {
        ++ok;
      } else if (want_ok && !error.empty()) {
        ADD_FAILURE() << name << " / " << cname << ": Jinja2 rendered it, kvserve failed: " << error;
      } else if (!want_ok) {
        ADD_FAILURE() << name << " / " << cname << ": Jinja2 failed (" << want["error"].get<std::string>()
                      << "), kvserve rendered it";
      } else {
        ADD_FAILURE() << name << " / " << cname << ": " << where_differs(want["text"].get<std::string>(), got);
      }
    }
    std::printf("%-52s %2d/%d match (%d texts, %d errors on both sides)\n", name.c_str(), ok, n, texts, ok - texts);
    total += n;
    matched += ok;
    rendered += texts;
  }
  std::printf("all: %d/%d cases match, %d of them rendered texts\n", matched, total, rendered);
  EXPECT_EQ(matched, total);
}

namespace {

// A case whose assistant turns with tool_calls carry `content` and whose
// arguments are the client's JSON strings, or the objects parsed from them.
ordered_json tool_call_variant(const ordered_json& c, const std::string& suffix, const ordered_json& content,
                               bool object_arguments) {
  ordered_json v = c;
  v["name"] = c["name"].get<std::string>() + suffix;
  for (auto& m : v["vars"]["messages"]) {
    if (!m.contains("tool_calls")) continue;
    m["content"] = content;
    for (auto& tc : m["tool_calls"]) {
      ordered_json& a = tc["function"]["arguments"];
      if (object_arguments && a.is_string()) a = ordered_json::parse(a.get<std::string>());
    }
  }
  return v;
}

size_t none_words(const std::string& s) {
  size_t n = 0;
  for (const char* w : {"None", "null"})
    for (size_t at = s.find(w); at != std::string::npos; at = s.find(w, at + 1)) ++n;
  return n;
}

}  // namespace

// An assistant turn that only calls tools (content null, arguments as JSON
// strings, as OpenAI clients send it) through the server's ChatTemplate,
// against Jinja2 given the null as Hugging Face transformers passes it, with
// the arguments as objects (as vLLM makes them), or as the strings sent when
// only those render the call (DeepSeek-R1-Distill-Llama). Where the template
// fails on null or prints it, the reference is empty text (vLLM's). Before,
// null was always empty text: DeepSeek-R1-Distill-Llama dropped the call,
// R1-Distill-Qwen and rwkv-world rendered an extra empty turn.
TEST(JinjaOracle, NullContentBesideToolCallsRendersAsTransformers) {
  ordered_json cases = ordered_json::array();
  for (const ordered_json& c : chat_cases()) {
    const std::string n = c["name"].get<std::string>();
    if (n != "tool_calls_str" && n != "tool_call_answered_str" && n != "tool_calls_id9_str") continue;
    cases.push_back(tool_call_variant(c, "/null_obj", nullptr, true));
    cases.push_back(tool_call_variant(c, "/null_str", nullptr, false));
    cases.push_back(tool_call_variant(c, "/empty_obj", "", true));
  }
  ASSERT_EQ(cases.size(), 9u);
  // ChatTemplate's strftime_now reads the real clock (gpt-oss prints the date).
  const time_t secs = time(nullptr);
  std::tm now{};
  gmtime_r(&secs, &now);
  const Oracle o = run_oracle(cases, now);
  kvs::Vocab vocab;
  vocab.tokens = {"<unk>", "<s>", "</s>"};
  vocab.bos = 1;
  vocab.eos = 2;
  int checked = 0;
  for (const auto& [name, path] : o.templates) {
    const ordered_json& r = o.results["results"][name];
    std::optional<kvs::server::ChatTemplate> t;
    try {
      t = kvs::server::ChatTemplate::jinja(kvs::test::read_file(path), name, vocab);
    } catch (const kvs::server::ChatTemplateError&) {
    }
    for (size_t i = 0; i < cases.size(); i += 3) {
      const std::string base = cases[i]["name"].get<std::string>().substr(0, cases[i]["name"].get<std::string>().find('/'));
      auto text = [&](const char* v) -> std::optional<std::string> {
        const ordered_json& x = r[base + v];
        return x["ok"].get<bool>() ? std::optional(x["text"].get<std::string>()) : std::nullopt;
      };
      const auto null_obj = text("/null_obj"), null_str = text("/null_str"), empty_obj = text("/empty_obj");
      const size_t dirt = empty_obj ? none_words(*empty_obj) : 0;
      std::string fn;  // the case's first call
      for (const ordered_json& m : cases[i]["vars"]["messages"])
        if (fn.empty() && m.contains("tool_calls")) fn = m["tool_calls"][0]["function"]["name"].get<std::string>();
      auto shows = [&](const std::optional<std::string>& s) { return s && s->find(fn) != std::string::npos; };
      std::optional<std::string> want = empty_obj;
      if (null_obj && none_words(*null_obj) <= dirt) want = null_obj;
      else if (null_str && none_words(*null_str) <= dirt && shows(null_str) && !shows(empty_obj)) want = null_str;
      std::optional<std::string> got;
      if (t) {
        const ordered_json& vars = cases[i + 1]["vars"];  // null and strings: what a client sends
        kvs::server::ChatInputs in;
        in.messages = vars["messages"];
        in.tools = vars["tools"];
        try {
          got = t->render_raw(in);
        } catch (const kvs::server::ChatTemplateError&) {
        }
      }
      ++checked;
      if (!want) {
        EXPECT_FALSE(got) << name << " / " << base << ": Jinja2 fails, kvserve rendered it";
      } else if (!got) {
        ADD_FAILURE() << name << " / " << base << ": Jinja2 renders it, kvserve failed";
      } else {
        EXPECT_EQ(*got, *want) << name << " / " << base << ": " << where_differs(*want, *got);
      }
    }
  }
  EXPECT_EQ(checked, 120);
}
