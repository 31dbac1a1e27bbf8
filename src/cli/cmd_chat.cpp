// `kvserve chat`: an interactive terminal chat on one model, with a bounded
// KV (rolling summary or sliding window), optional --ram-budget sizing and
// device-aware shedding. Opens no network listener.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <random>

#include "chat/chat_repl.h"
#include "chat/chat_session.h"
#include "chat/session_store.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/on_device.h"
#include "model/model.h"
#include "server/chat_template.h"
#include "tools/default_model.h"

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
};

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

int run_chat(ChatArgs a) {
  a.m.model = resolve_model_path(a.m.model);
  tools::RamBudgetInput rin;
  rin.block_size = a.o.block_size;
  rin.want_ctx = a.o.hard_cap;
  rin.max_tokens = a.o.max_tokens;
  const auto budget = ram_budget_choice(a.ram_budget, a.m.model, rin);
  Loaded l = load_all(a.m, a.o.hard_cap);
  std::string note;
  server::ChatTemplate tmpl = server::ChatTemplate::choose(a.chat_template, l.model->vocab(), &note);
  std::fprintf(stderr, "kvserve: %s\n", note.c_str());
  a.o.cache = a.kv.options();
  if (budget) {
    a.o.cache = {};
    a.o.cache.type = budget->kv_type;
    a.o.hard_cap = budget->hard_cap;
    a.o.window = budget->window;
    a.o.max_tokens = budget->max_tokens;
  }
  a.o.sampling.temperature = a.temp;
  a.o.sampling.top_k = a.top_k;
  a.o.sampling.top_p = a.top_p;
  a.o.sampling.min_p = a.min_p;
  a.o.sampling.repeat_penalty = a.repeat_penalty;
  a.o.sampling.seed = a.seed >= 0 ? uint64_t(a.seed) : std::random_device{}();
  chat::ChatSession session(*l.engine, *l.tok, std::move(tmpl), a.o);
  std::unique_ptr<device::DeviceMonitor> monitor = make_device_monitor(a.dev);
  chat::SessionStore store(a.sessions.folder(), a.sessions.keying(), l.model->identity());
  if (!a.resume.empty()) resume(session, store, a.resume);
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
  c->add_option("--top-k", a->top_k, "Top-k (0 = off)")->capture_default_str();
  c->add_option("--top-p", a->top_p, "Top-p (1 = off)")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  c->add_option("--min-p", a->min_p, "Min-p (0 = off)")->capture_default_str()->check(CLI::Range(0.0, 1.0));
  c->add_option("--repeat-penalty", a->repeat_penalty, "Repetition penalty (1 = off)")->capture_default_str();
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
  c->callback([a, &run] { run = [a] { return run_chat(*a); }; });
}

}  // namespace kvs::cli
