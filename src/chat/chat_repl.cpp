#include "chat/chat_repl.h"

#include <chrono>
#include <cstdio>
#include <istream>
#include <ostream>
#include <stdexcept>

#include "engine/kv_cache.h"

namespace kvs::chat {

namespace {
const char* kPrompt = ">>> ";
const char* kMore = "... ";

std::string ms(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f ms", s * 1e3);
  return b;
}
std::string kib(int64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f KiB", double(bytes) / 1024.0);
  return b;
}
}  // namespace

ChatRepl::ChatRepl(ChatSession& s, std::istream& in, std::ostream& out, device::DeviceMonitor* mon,
                   std::function<double()> clock)
    : s_(s), in_(in), out_(out), mon_(mon), clock_(std::move(clock)) {
  if (!clock_)
    clock_ = [] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    };
  base_max_tokens_ = s_.stats().max_tokens;
}

bool ChatRepl::read_message(std::string& msg) {
  msg.clear();
  out_ << kPrompt << std::flush;
  std::string line;
  if (!std::getline(in_, line)) return false;
  if (line == "\"\"\"") {  // block mode until the closing quotes
    bool first = true;
    for (;;) {
      out_ << kMore << std::flush;
      if (!std::getline(in_, line) || line == "\"\"\"") break;
      msg += (first ? "" : "\n") + line;
      first = false;
    }
    return true;
  }
  while (!line.empty() && line.back() == '\\') {
    line.pop_back();
    msg += line + "\n";
    out_ << kMore << std::flush;
    if (!std::getline(in_, line)) {
      line.clear();
      break;
    }
  }
  msg += line;
  return true;
}

void ChatRepl::run() {
  out_ << "kvserve chat: type a message; /help lists the commands; end a line with \\ to go on.\n";
  std::string msg;
  while (read_message(msg))
    if (!handle(msg)) break;
  out_ << "\n" << std::flush;
}

bool ChatRepl::handle(const std::string& input) {
  const size_t a = input.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return true;
  if (input[a] == '/') return command(input.substr(a + 1));
  reply(input);
  return true;
}

bool ChatRepl::command(const std::string& line) {
  const size_t sp = line.find(' ');
  const std::string name = line.substr(0, sp), arg = sp == std::string::npos ? "" : line.substr(sp + 1);
  if (name == "quit" || name == "exit" || name == "bye") return false;
  if (name == "reset") {
    apply_device();
    s_.reset();
    out_ << "(conversation cleared)\n";
  } else if (name == "stats") {
    if (mon_) mon_->poll(clock_());
    out_ << stats_text();
  } else if (name == "help") {
    out_ << "/reset  forget the conversation\n/stats  KV memory, window, summary, time per token, device\n";
    for (const auto& c : extra_) out_ << "/" << c.name << "  " << c.help << "\n";
    out_ << "/quit   leave\n";
  } else {
    for (const auto& c : extra_)
      if (c.name == name) return c.run(arg, out_);
    out_ << "unknown command /" << name << " (/help lists them)\n";
  }
  out_ << std::flush;
  return true;
}

bool ChatRepl::apply_device() {
  if (!mon_) return true;
  const device::DeviceState st = mon_->poll(clock_());
  s_.set_thread_share(st.plan.threads_scale);
  s_.set_max_tokens_cap(st.plan.max_tokens_scale < 1 ? device::scaled(base_max_tokens_, st.plan.max_tokens_scale) : 0);
  if (st.plan.int4_new_sequences) {
    KvCacheOptions c;
    c.type = KvType::Int4;
    c.key_scale = KeyScale::Channel;
    s_.set_rebuild_cache(c);
  } else {
    s_.set_rebuild_cache(std::nullopt);
  }
  return !st.plan.stop_admissions;
}

void ChatRepl::reply(const std::string& msg) {
  if (!apply_device()) {
    out_ << "(the device is " << device::to_string(mon_->state().level)
         << ": not starting a reply now; try again in a moment, /stats shows why)\n"
         << std::flush;
    return;
  }
  try {
    const ReplyResult r = s_.reply(msg, [&](const std::string& piece) {
      out_ << piece << std::flush;
      return true;
    });
    out_ << "\n" << std::flush;
    (void)r;
  } catch (const std::length_error& e) {
    out_ << "\n(" << e.what() << ")\n" << std::flush;
  }
}

std::string ChatRepl::stats_text() const {
  const ChatStats st = s_.stats();
  std::string s;
  s += "kv: " + std::to_string(st.live_blocks) + " of " + std::to_string(st.capacity_blocks) + " blocks in use (" +
       kib(st.kv_bytes) + "), peak " + std::to_string(st.peak_blocks) + ", " + std::to_string(st.n_past) +
       " tokens; " + st.kv_desc + "\n";
  if (st.summary_mode)
    s += "window: hard cap " + std::to_string(st.hard_cap) + " tokens, " + std::to_string(st.window) +
         " kept after an eviction; rolling summary on (" + std::to_string(st.turns_kept) + " turns kept, " +
         std::to_string(st.turns_evicted) + " evicted, " + std::to_string(st.summaries) + " summaries)\n";
  else
    s += "window: sliding, " + st.window_desc + "\n";
  s += "max tokens per reply: " + std::to_string(st.max_tokens) + "\n";
  s += "summary: " + std::to_string(st.summary_tokens) + " tokens" +
       (st.summary.empty() ? std::string(" (none yet)") : ": " + st.summary) + "\n";
  s += "last reply: " + ms(st.last_ttft_s) + " to the first token, " + std::to_string(st.last_prompt_tokens) +
       " tokens prefilled\n";
  s += "tpot: p50 " + ms(st.tpot_p50_s) + ", p99 " + ms(st.tpot_p99_s) + " over " + std::to_string(st.tpot_samples) +
       " tokens\n";
  s += "device: " + (mon_ ? mon_->state().describe() : std::string("not monitored")) + "\n";
  return s;
}

}  // namespace kvs::chat
