// The oracle test: every chat template in ../shared/chat-templates rendered
// on a set of conversations (tests/jinja/chat_cases.json) by the reference
// Jinja2, set up as Hugging Face transformers sets it up
// (tests/jinja/jinja_oracle.py, one Python process for all of them), and
// by kvserve's engine. The texts must be equal byte for byte, or both
// sides must fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "jinja/template.h"
#include "test_util.h"

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
  auto around = [&](const std::string& s) { return ordered_json(s.substr(i < 40 ? 0 : i - 40, 120)).dump(); };
  return "first difference at byte " + std::to_string(i) + " (lengths " + std::to_string(want.size()) + " and " +
         std::to_string(got.size()) + ")\n  jinja2: " + around(want) + "\n  kvserve: " + around(got);
}

struct Oracle {
  std::vector<std::pair<std::string, std::string>> templates;  // name, path
  ordered_json cases;
  ordered_json results;
};

Oracle run_oracle() {
  Oracle o;
  const fs::path dir = kvs::test::shared("chat-templates");
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".jinja") o.templates.emplace_back(e.path().stem().string(), e.path().string());
  std::sort(o.templates.begin(), o.templates.end());
  o.cases =
      ordered_json::parse(kvs::test::read_file(std::string(KVS_SOURCE_DIR) + "/tests/jinja/chat_cases.json"))["cases"];
  ordered_json req = {{"templates", ordered_json::array()}, {"cases", o.cases}, {"now", ordered_json::array()}};
  for (const auto& [name, path] : o.templates) req["templates"].push_back({{"name", name}, {"path", path}});
  for (int x : kNow) req["now"].push_back(x);
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
