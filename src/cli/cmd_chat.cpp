// `kvserve chat`: an interactive terminal chat on one model, with a bounded
// KV (rolling summary or sliding window), optional --ram-budget sizing and
// device-aware shedding. Opens no network listener.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>
#include <stdexcept>
#include <vector>

#include "chat/chat_repl.h"
#include "chat/chat_session.h"
#include "chat/session_store.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/on_device.h"
#include "model/model.h"
#include "server/chat_template.h"
#include "tools/default_model.h"
#include "tools/ram_budget.h"
#include "tools/units.h"

namespace kvs::cli {

namespace {
struct ChatArgs {
  ModelArgs m;
  chat::ChatOptions o;
  float temp = 0.8f, top_p = 0.95f, min_p = 0.05f, repeat_penalty = 1.1f;
  int top_k = 40;
  int64_t seed = -1;
  std::string chat_template = "auto", ram_budget;
  KvArgs kv;
  DeviceArgs dev;
  SessionArgs sessions;
  std::string resume;
  // Options given on the command line: --ram-budget plans around them
  // instead of choosing them. given: "-c 256, --kv-type f32", for messages.
  bool set_ctx = false, set_window = false, set_max_tokens = false, set_kv_type = false, set_kv_other = false;
  std::string given;
};

// The hard cap the budget leaves for the KV format the user gave.
int cap_for_given_kv(const tools::RamBudgetInput& in, const tools::RamBudgetChoice& c, const KvCacheOptions& cache,
                     int ctx) {
  KvLayout l = tools::ram_budget_layout(in.model, cache.type, in.block_size);
  l.key_scale = cache.key_scale;
  l.group_tokens = cache.residual > 0 ? cache.residual : in.block_size;
  l.group_channels = cache.group_channels;
  l.validate();
  return tools::hard_cap_that_fits(l, c.budget_bytes - c.weight_bytes - c.scratch_bytes, ctx, c.max_batch_tokens);
}

std::string budget_line(const ChatArgs& a, const tools::RamBudgetChoice& c) {
  std::vector<std::string> chose;
  if (!a.set_kv_type)
    chose.push_back(std::string(to_string(a.o.cache.type)) + " KV" +
                    (a.set_kv_other ? "" : std::string(" (keys/channel)")));
  if (!a.set_ctx) chose.push_back("hard cap " + std::to_string(a.o.hard_cap));
  if (!a.set_window) chose.push_back("window " + std::to_string(a.o.window));
  if (!a.set_max_tokens) chose.push_back("max tokens " + std::to_string(a.o.max_tokens));
  std::string s = "--ram-budget " + tools::format_bytes(double(c.budget_bytes)) + " (weights " +
                  tools::format_bytes(double(c.weight_bytes)) + " + scratch " +
                  tools::format_bytes(double(c.scratch_bytes)) + ") chose ";
  for (size_t i = 0; i < chose.size(); ++i) s += (i ? ", " : "") + chose[i];
  if (chose.empty()) s += "nothing";
  if (!a.given.empty()) s += "; kept as given: " + a.given;
  return s;
}

// --ram-budget: the planner's choice (KV format, hard cap, window, max
// tokens) for what the user left open; what they gave is kept, and refused
// with the options named when it does not fit. Reads only the GGUF header.
void apply_ram_budget(ChatArgs& a) {
  tools::RamBudgetInput in;
  in.budget_bytes = tools::parse_size(a.ram_budget);
  in.model = tools::shape_from_gguf(a.m.model);
  in.block_size = a.o.block_size;
  in.want_ctx = a.o.hard_cap;
  in.max_tokens = a.o.max_tokens;
  const tools::RamBudgetChoice c = tools::choose_for_budget(in);
  const std::string head = "--ram-budget " + a.ram_budget + " ";
  const int ctx = in.want_ctx > 0 ? in.want_ctx : std::max(in.model.n_ctx, tools::kMinHardCap);
  KvCacheOptions cache = a.kv.options();
  if (!a.set_kv_type) cache.type = c.kv_type;
  int cap = c.hard_cap;
  if (a.set_kv_type || a.set_kv_other) {
    cap = cap_for_given_kv(in, c, cache, ctx);
    if (cap < tools::kMinHardCap || (a.set_ctx && cap < ctx))
      throw std::runtime_error(head + "leaves room for " + std::to_string(cap) + " tokens of KV with " + a.given +
                               ": change those options or raise the budget");
  } else if (a.set_ctx && cap < ctx) {
    throw std::runtime_error(head + "holds " + std::to_string(cap) + " tokens of KV even in " + to_string(c.kv_type) +
                             ", fewer than -c " + std::to_string(ctx) + ": lower -c or raise the budget");
  }
  a.o.cache = cache;
  a.o.hard_cap = cap;
  if (!a.set_window) a.o.window = cap / 2;
  else if (a.o.window >= cap)
    throw std::runtime_error(head + "leaves a hard cap of " + std::to_string(cap) + " tokens; --window " +
                             std::to_string(a.o.window) + " must be below it");
  if (!a.set_max_tokens) a.o.max_tokens = std::max(1, std::min({a.o.max_tokens, cap / 4, a.o.window - 1}));
  else if (a.o.max_tokens >= a.o.window)
    throw std::runtime_error(head + "leaves a window of " + std::to_string(a.o.window) + " tokens; -n " +
                             std::to_string(a.o.max_tokens) + " must be below it");
  // The planner's own description holds only when it picked everything it lists.
  if (!a.set_kv_type && !a.set_kv_other && !a.set_window && !a.set_max_tokens)
    std::fprintf(stderr, "kvserve: %s\n", c.describe().c_str());
  std::fprintf(stderr, "kvserve: %s\n", budget_line(a, c).c_str());
}

// /save and /logout on the encrypted session store.
void add_session_commands(chat::ChatRepl& repl, chat::ChatSession& session, chat::SessionStore& store) {
  repl.add_command({"save", "[NAME] encrypt the conversation and its KV to disk (default name: default)",
                    [&](const std::string& arg, std::ostream& out) {
                      const std::string name = arg.empty() ? "default" : arg;
                      try {
                        store.save(name, session.snapshot());
                        out << "(saved session '" << name << "', encrypted, in " << store.dir() << ")\n";
                      } catch (const std::exception& e) {
                        out << "(not saved: " << e.what() << ")\n";
                      }
                      return true;
                    }});
  repl.add_command({"logout", "delete every saved session and the key, then leave", [&](const std::string&, std::ostream& out) {
                      session.reset();
                      const int n = store.wipe();
                      out << "(logged out: " << n << " files shredded in " << store.dir() << ")\n";
                      return false;
                    }});
}

void resume(chat::ChatSession& session, const chat::SessionStore& store, const std::string& name) {
  const auto t0 = std::chrono::steady_clock::now();
  session.restore(store.load(name));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const chat::ChatStats st = session.stats();
  std::fprintf(stderr, "kvserve: resumed session '%s': %d turns, %d tokens of KV restored in %.1f ms (no recompute)\n",
               name.c_str(), st.turns_kept, st.n_past, ms);
}

// A reply must be shorter than the window it is generated in. The default
// -n gives way on a small model (stories260K: a cap of 512, so a window of
// 256); a given -n that does not fit is an error naming both.
void fit_reply_budget(ChatArgs& a, int trained) {
  const int cap = a.o.hard_cap > 0 ? a.o.hard_cap : trained;
  const int window = a.o.window > 0 ? a.o.window : cap / 2;
  if (window < 2 || a.o.max_tokens < window) return;
  if (a.set_max_tokens)
    throw std::runtime_error("chat: -n " + std::to_string(a.o.max_tokens) + " must be below the window of " +
                             std::to_string(window) + " tokens (--window, default half of the cap " +
                             std::to_string(cap) + "); pass -n " + std::to_string(window - 1) +
                             " or a larger -c / --window");
  a.o.max_tokens = window - 1;
  std::fprintf(stderr, "kvserve: note: at most %d tokens per reply (-n), below the window of %d tokens\n",
               a.o.max_tokens, window);
}

int run_chat(ChatArgs a) {
  // The session options are checked before the model loads and the user types.
  a.sessions.keying();
  std::string folder_note;
  try {
    folder_note = chat::check_session_folder(a.sessions.folder());
  } catch (const chat::SessionError& e) {
    // The default folder is not asked for: a chat that never saves still runs.
    if (!a.sessions.dir.empty()) throw;
    folder_note = std::string(e.what()) + " (/save will fail)";
  }
  if (!folder_note.empty()) std::fprintf(stderr, "kvserve: note: %s\n", folder_note.c_str());
  a.m.model = resolve_model_path(a.m.model);
  const int want_ctx = a.o.hard_cap;
  a.o.cache = a.kv.options();
  if (!a.ram_budget.empty()) apply_ram_budget(a);
  Loaded l = load_all(a.m, want_ctx, false);  // (warned below, about the cap it settled on)
  const int trained = l.model->config().n_ctx_train;
  if (trained > 0 && a.o.hard_cap > trained)
    std::fprintf(stderr, "kvserve: warning: hard cap %d tokens is beyond the model's trained context of %d; "
                 "replies past it may degrade\n", a.o.hard_cap, trained);
  fit_reply_budget(a, trained);
  std::string note;
  server::ChatTemplate tmpl = server::ChatTemplate::choose(a.chat_template, l.model->vocab(), &note);
  std::fprintf(stderr, "kvserve: %s\n", note.c_str());
  a.o.sampling.temperature = a.temp;
  a.o.sampling.top_k = a.top_k;
  a.o.sampling.top_p = a.top_p;
  a.o.sampling.min_p = a.min_p;
  a.o.sampling.repeat_penalty = a.repeat_penalty;
  a.o.sampling.seed = a.seed >= 0 ? uint64_t(a.seed) : std::random_device{}();
  chat::ChatSession session(*l.engine, *l.tok, std::move(tmpl), a.o);
  session.set_notice_sink([](const std::string& what) { std::fprintf(stderr, "kvserve: note: %s\n", what.c_str()); });
  std::unique_ptr<device::DeviceMonitor> monitor = make_device_monitor(a.dev);
  chat::SessionStore store(a.sessions.folder(), a.sessions.keying(), l.model->identity());
  if (!a.resume.empty()) {
    resume(session, store, a.resume);
    // The restored K/V stays in the format it was saved in (no recompute).
    if (a.set_kv_type || a.set_kv_other)
      std::fprintf(stderr, "kvserve: note: session '%s' keeps the KV format it was saved with (%s): the --kv-* "
                   "options given do not apply to a resumed session (start without --resume to use them)\n", a.resume.c_str(),
                   session.stats().kv_desc.c_str());
  }
  chat::ChatRepl repl(session, std::cin, std::cout, monitor.get());
  add_session_commands(repl, session, store);
  const chat::ChatStats st = session.stats();
  std::fprintf(stderr, "kvserve: chat on %s: KV %s, %s (hard cap %d tokens), %d blocks allocated\n",
               l.model->path().c_str(), st.kv_desc.c_str(),
               st.summary_mode ? "rolling summary" : st.window_desc.c_str(), st.hard_cap, st.capacity_blocks);
  repl.run();
  return 0;
}
}  // namespace

void add_chat(CLI::App& app, Runner& run) {
  auto a = std::make_shared<ChatArgs>();
  CLI::App* c = app.add_subcommand("chat", "Interactive chat in the terminal (no network listener)");
  add_model_args(c, a->m);
  c->add_option("--system", a->o.system, "System prompt")->capture_default_str();
  c->add_option("-c,--ctx", a->o.hard_cap, "Hard cap: most tokens the KV holds (default: the model's context)")
      ->check(CLI::Range(0, 1 << 22));
  c->add_option("--window", a->o.window, "Rolling summary: tokens kept after an eviction (default: half the cap)")
      ->check(CLI::Range(0, 1 << 22));
  c->add_option("-n,--max-tokens", a->o.max_tokens, "Most tokens per reply")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  c->add_flag("--summary,!--no-summary", a->o.summary,
              "Summarize evicted turns into a rolling summary (default on); off: the window slides")
      ->capture_default_str();
  c->add_option("--summary-tokens", a->o.summary_tokens, "Token budget of one summary (default: a quarter of the window, at most 64)")
      ->check(CLI::Range(1, 1 << 16));
  c->add_option("--sinks", a->o.sinks, "Sliding window: attention sinks kept")->capture_default_str()->check(CLI::Range(0, 1024));
  c->add_option("--temp", a->temp, "Temperature (0 = greedy)")->capture_default_str()->check(CLI::Range(0.0, 100.0));
  c->add_option("--top-k", a->top_k, "Top-k (0 or -1 = off)")
      ->capture_default_str()
      ->check(CLI::Range(-1, 1 << 24));
  c->add_option("--top-p", a->top_p, "Top-p (1 = off)")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  c->add_option("--min-p", a->min_p, "Min-p (0 = off)")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  c->add_option("--repeat-penalty", a->repeat_penalty, "Repetition penalty (1 = off)")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 10.0));  // the server's repetition_penalty range
  c->add_option("-s,--seed", a->seed, "Sampling seed (default: random)");
  c->add_option("--chat-template", a->chat_template,
                "auto (the model's own template), llama2, llama3, chatml, mistral, plain, a template the model file names "
                "(tokenizer.chat_template.NAME) or a Jinja file")
      ->capture_default_str();
  c->add_option("--ram-budget", a->ram_budget,
                "Memory for weights + KV + scratch (e.g. 512MiB): picks the KV type, hard cap and reply length");
  add_kv_args(c, a->kv);
  add_device_args(c, a->dev, true);
  add_session_args(c, a->sessions);
  c->add_option("--resume", a->resume, "Resume a session saved with /save NAME (its KV comes back without recompute)");
  c->callback([a, c, &run] {
    // Which options were given decides what --ram-budget may choose.
    auto given = [&](const char* name, const std::string& shown) {
      if (c->get_option(name)->count() == 0) return false;
      a->given += (a->given.empty() ? "" : ", ") + shown;
      return true;
    };
    a->set_ctx = given("--ctx", "-c " + std::to_string(a->o.hard_cap));
    a->set_window = given("--window", "--window " + std::to_string(a->o.window));
    a->set_max_tokens = given("--max-tokens", "-n " + std::to_string(a->o.max_tokens));
    a->set_kv_type = given("--kv-type", "--kv-type " + a->kv.type);
    const bool scale = given("--kv-key-scale", "--kv-key-scale " + a->kv.key_scale);
    const bool residual = given("--kv-residual", "--kv-residual " + std::to_string(a->kv.residual));
    const bool group = given("--kv-group", "--kv-group " + std::to_string(a->kv.group));
    a->set_kv_other = scale || residual || group;
    run = [a] { return run_chat(*a); };
  });
}

}  // namespace kvs::cli
