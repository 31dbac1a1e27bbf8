#include "server/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "jinja/template.h"
#include "server/tenants.h"
#include "server/tool_request.h"
#include "tokenizer/vocab.h"

namespace kvs::server {

using nlohmann::ordered_json;

namespace {

// The text of OpenAI text parts, one line each as vLLM joins them (glued
// together, "part one" "part two" would read "part onepart two"); other
// parts are left out.
std::string parts_text(const ordered_json& parts) {
  std::string s;
  bool first = true;
  for (const auto& p : parts) {
    if (!p.is_object() || !p.contains("text") || !p["text"].is_string()) continue;
    if (!first) s += '\n';
    s += p["text"].get<std::string>();
    first = false;
  }
  return s;
}

std::optional<std::string> token_text(const Vocab& v, int id) {
  if (id < 0 || size_t(id) >= v.tokens.size()) return std::nullopt;
  return v.tokens[size_t(id)];
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

bool has_tool_calls(const ordered_json& m) {
  const auto it = m.find("tool_calls");
  return it != m.end() && it->is_array() && !it->empty();
}

// How often a rendering says None or null: a template printing a null content.
size_t none_words(const std::string& s) {
  size_t n = 0;
  for (const char* w : {"None", "null"})
    for (size_t at = s.find(w); at != std::string::npos; at = s.find(w, at + 1)) ++n;
  return n;
}

// A question, an assistant turn that only calls a tool (null content,
// arguments as the client's JSON string), and the tool's answer.
ChatInputs tool_call_probe(const std::string& fn) {
  ChatInputs in;
  const ordered_json call = {{"id", "call00001"},
                             {"type", "function"},
                             {"function", {{"name", fn}, {"arguments", "{\"a\": 1}"}}}};
  in.messages = ordered_json::array({{{"role", "user"}, {"content", "Question?"}},
                                     {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {call}}},
                                     {{"role", "tool"}, {"tool_call_id", "call00001"}, {"content", "Answer."}}});
  const ordered_json params = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}};
  in.tools = ordered_json::array(
      {{{"type", "function"}, {"function", {{"name", fn}, {"description", "Probe."}, {"parameters", params}}}}});
  return in;
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("--chat-template: cannot read " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

std::vector<ChatMessage> plain_messages(const ordered_json& messages) {
  std::vector<ChatMessage> out;
  for (const auto& m : messages) {
    ChatMessage cm;
    if (m.contains("role") && m["role"].is_string()) cm.role = m["role"].get<std::string>();
    if (m.contains("content")) {
      const ordered_json& c = m["content"];
      if (c.is_string()) cm.content = c.get<std::string>();
      else if (c.is_array()) cm.content = parts_text(c);
    }
    out.push_back(std::move(cm));
  }
  return out;
}

ChatTemplate ChatTemplate::fixed(ChatFamily f) {
  ChatTemplate t;
  t.family_ = f;
  t.description_ = std::string(to_string(f)) + " (hand-written)";
  t.fingerprint_ = "chat-v1:" + sha256_hex("family:" + std::string(to_string(f)));
  return t;
}

ChatTemplate ChatTemplate::jinja(const std::string& source, const std::string& name, const Vocab& vocab) {
  ChatTemplate t;
  try {
    t.jinja_ = std::make_shared<const jinja::Template>(source, name);
  } catch (const jinja::Error& e) {
    throw ChatTemplateError(e.what(), false);
  }
  t.description_ = name + " (Jinja)";
  t.fingerprint_ = "chat-v1:" + sha256_hex("jinja:" + source);
  t.tool_format_ = tool_format_of(source);
  t.bos_ = token_text(vocab, vocab.bos);
  t.eos_ = token_text(vocab, vocab.eos);
  t.strip_bos_ = vocab.add_bos && t.bos_ && !t.bos_->empty();
  t.strip_eos_ = vocab.add_eos && t.eos_ && !t.eos_->empty();
  // Probes: does the template print a string content, and does it read
  // text parts? (Many only do one of the two; a request may send either.)
  static const std::string kProbe = "kvserve-content-probe-7f3a";
  t.takes_string_ = t.takes_parts_ = true;  // the probes see content as given
  auto shows = [&](const ordered_json& content) {
    ChatInputs in;
    in.messages = ordered_json::array({{{"role", "user"}, {"content", content}}});
    try {
      // Printing the parts' structure (repr or JSON) is not reading them.
      const std::string out = t.render_raw(in);
      return out.find(kProbe) != std::string::npos && out.find("'text': '" + kProbe) == std::string::npos &&
             out.find("\"text\": \"" + kProbe) == std::string::npos;
    } catch (const ChatTemplateError&) {
      return false;
    }
  };
  const bool str = shows(kProbe), parts = shows(ordered_json::array({{{"type", "text"}, {"text", kProbe}}}));
  t.takes_string_ = str || !parts;
  t.takes_parts_ = parts;
  t.probe_tool_call_turns();
  return t;
}

void ChatTemplate::probe_tool_call_turns() {
  static const std::string kFn = "kvserve_probe_fn";
  const ChatInputs in = tool_call_probe(kFn);
  auto render_as = [&](bool keep_null, bool string_args) -> std::optional<std::string> {
    null_with_calls_ = keep_null;
    string_arguments_ = string_args;
    try {
      return render_raw(in);
    } catch (const ChatTemplateError&) {
      return std::nullopt;
    }
  };
  const auto fallback = render_as(false, false);  // empty text, object arguments: what vLLM passes
  const auto null_obj = render_as(true, false), null_str = render_as(true, true);
  auto clean = [&](const std::optional<std::string>& r) {
    return r && none_words(*r) <= (fallback ? none_words(*fallback) : 0);
  };
  auto shows_call = [&](const std::optional<std::string>& r) { return r && r->find(kFn) != std::string::npos; };
  null_with_calls_ = string_arguments_ = false;
  if (clean(null_obj)) {
    null_with_calls_ = true;
  } else if (clean(null_str) && shows_call(null_str) && !shows_call(fallback)) {
    // DeepSeek-R1-Distill-Llama: it renders the call only for a null
    // content and concatenates the arguments as text.
    null_with_calls_ = string_arguments_ = true;
  }
}

ChatTemplate ChatTemplate::choose(const std::string& option, const Vocab& vocab, std::string* note) {
  auto say = [&](const std::string& s) {
    if (note) *note = "chat template: " + s;
  };
  auto jinja_or_fail = [&](const std::string& source, const std::string& name, const std::string& hint) {
    try {
      return jinja(source, name, vocab);
    } catch (const ChatTemplateError& e) {
      throw std::runtime_error(std::string("the chat template does not parse: ") + e.what() + hint);
    }
  };
  if (option == "auto") {
    if (vocab.chat_template.empty()) {
      say("the model has none; using the plain \"role: content\" fallback");
      return fixed(ChatFamily::Plain);
    }
    ChatTemplate t = jinja_or_fail(vocab.chat_template, "tokenizer.chat_template",
                                   " (pass --chat-template NAME or FILE to use another)");
    say("the model's tokenizer.chat_template (Jinja)");
    return t;
  }
  if (auto f = parse_chat_family(option)) {
    say(std::string(to_string(*f)) + " (--chat-template)");
    return fixed(*f);
  }
  std::string variants;
  for (const auto& [name, text] : vocab.chat_template_variants) {
    if (name == option) {
      ChatTemplate t = jinja_or_fail(text, "tokenizer.chat_template." + name, "");
      say("the model's tokenizer.chat_template." + name + " (Jinja, --chat-template)");
      return t;
    }
    variants += ", " + name;
  }
  std::error_code ec;
  if (std::filesystem::is_regular_file(option, ec)) {
    ChatTemplate t = jinja_or_fail(read_text_file(option), option, "");
    say(option + " (Jinja, --chat-template)");
    return t;
  }
  throw std::runtime_error("--chat-template '" + option +
                           "' is not a file, nor one of auto, llama2, llama3, chatml, mistral, plain" + variants);
}

ordered_json ChatTemplate::adapt_messages(const ordered_json& messages) const {
  // Content in the form the template reads: text parts joined into a string
  // for a template that only prints strings, a string made one text part for
  // one that only reads parts, null as the probes found (above).
  ordered_json out = string_arguments_ ? messages : template_messages(messages);
  for (auto& m : out) {
    if (!m.is_object() || !m.contains("content")) continue;
    ordered_json& c = m["content"];
    // Elsewhere null is empty text, as vLLM and llama.cpp hand it over:
    // templates test it with `in`, or would print "None".
    if (c.is_null()) {
      if (!(null_with_calls_ && has_tool_calls(m))) c = takes_string_ ? ordered_json("") : ordered_json::array();
    } else if (c.is_array() && !takes_parts_) c = parts_text(c);
    else if (c.is_string() && !takes_string_) c = ordered_json::array({{{"type", "text"}, {"text", c}}});
  }
  return out;
}

ordered_json ChatTemplate::variables(const ChatInputs& in) const {
  // As transformers' apply_chat_template: messages, tools and documents
  // (None when absent), add_generation_prompt, the special tokens, then the
  // caller's extra variables.
  ordered_json v = ordered_json::object();
  v["messages"] = adapt_messages(in.messages);
  v["tools"] = in.tools;
  v["documents"] = nullptr;
  v["add_generation_prompt"] = in.add_generation_prompt;
  if (bos_) v["bos_token"] = *bos_;
  if (eos_) v["eos_token"] = *eos_;
  for (const auto& [k, x] : in.extra.items()) v[k] = x;
  return v;
}

std::string ChatTemplate::render_raw(const ChatInputs& in) const {
  if (family_) return render_chat(*family_, plain_messages(in.messages), in.add_generation_prompt);
  try {
    return jinja_->render(variables(in));
  } catch (const jinja::Error& e) {
    throw ChatTemplateError(e.what(), e.kind() == jinja::ErrorKind::Raised);
  }
}

std::string ChatTemplate::render(const ChatInputs& in) const {
  std::string text = render_raw(in);
  if (strip_bos_ && starts_with(text, *bos_)) text.erase(0, bos_->size());
  if (strip_eos_ && ends_with(text, *eos_)) text.erase(text.size() - eos_->size());
  return text;
}

}  // namespace kvs::server
