#include "server/tool_calls.h"

#include <nlohmann/json.hpp>

namespace kvs::server {

using nlohmann::json;

namespace {

struct Markers {
  std::vector<std::string> start;
  std::string end;  // "" = the region runs to the next start marker or the end
};

Markers markers(ToolFormat f) {
  switch (f) {
    case ToolFormat::Hermes: return {{"<tool_call>"}, "</tool_call>"};
    case ToolFormat::Llama3: return {{"<|python_tag|>"}, ""};
    case ToolFormat::Mistral: return {{"[TOOL_CALLS]"}, ""};
    case ToolFormat::DeepSeek: return {{"<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"}, "<｜tool▁calls▁end｜>"};
    case ToolFormat::Granite: return {{"<|tool_call|>"}, ""};
    case ToolFormat::Harmony: return {{"<|channel|>", "<|start|>"}, ""};
    case ToolFormat::Functionary: return {{"<function="}, "</function>"};
    case ToolFormat::None: break;
  }
  return {};
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::optional<json> parse_json(std::string_view s) {
  try {
    return json::parse(trim(s));
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

// Arguments as a JSON object's text: an object, or a string holding one.
std::optional<std::string> arguments_text(const json& a) {
  if (a.is_object()) return a.dump();
  if (a.is_string()) {
    auto o = parse_json(a.get<std::string>());
    if (o && o->is_object()) return o->dump();
  }
  return std::nullopt;
}

// {"name": N, "arguments" | "parameters": {...}[, "id": I]}
std::optional<ToolCall> call_of(const json& j) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  const json* a = j.contains("arguments") ? &j["arguments"] : j.contains("parameters") ? &j["parameters"] : nullptr;
  const std::optional<std::string> args = a ? arguments_text(*a) : std::optional<std::string>("{}");
  if (!args) return std::nullopt;
  ToolCall c;
  c.name = j["name"];
  c.arguments = *args;
  if (j.contains("id") && j["id"].is_string()) c.id = j["id"];
  return c;
}

bool calls_of(const json& j, std::vector<ToolCall>& out) {
  if (j.is_array()) {
    for (const json& x : j) {
      auto c = call_of(x);
      if (!c) return false;
      out.push_back(*c);
    }
    return !j.empty();
  }
  auto c = call_of(j);
  if (c) out.push_back(*c);
  return c.has_value();
}

// <function=N><parameter=P>\nvalue\n</parameter>...</function>
std::optional<ToolCall> xml_call(std::string_view s) {
  s = trim(s);
  if (s.substr(0, 10) != "<function=") return std::nullopt;
  const size_t gt = s.find('>');
  const size_t end = s.rfind("</function>");
  if (gt == std::string_view::npos || end == std::string_view::npos || end < gt) return std::nullopt;
  ToolCall c;
  c.name = std::string(s.substr(10, gt - 10));
  json args = json::object();
  std::string_view rest = s.substr(gt + 1, end - gt - 1);
  while (true) {
    const size_t p = rest.find("<parameter=");
    if (p == std::string_view::npos) break;
    const size_t pg = rest.find('>', p);
    const size_t pe = rest.find("</parameter>", pg == std::string_view::npos ? p : pg);
    if (pg == std::string_view::npos || pe == std::string_view::npos) return std::nullopt;
    const std::string key(rest.substr(p + 11, pg - p - 11));
    std::string_view val = rest.substr(pg + 1, pe - pg - 1);
    if (!val.empty() && val.front() == '\n') val.remove_prefix(1);
    if (!val.empty() && val.back() == '\n') val.remove_suffix(1);
    auto v = parse_json(val);
    args[key] = v && !v->is_string() ? *v : json(std::string(val));  // a number, object...: as JSON
    rest = rest.substr(pe + 12);
  }
  if (!trim(rest).empty()) return std::nullopt;
  c.arguments = args.dump();
  return c;
}

}  // namespace

const char* to_string(ToolFormat f) {
  switch (f) {
    case ToolFormat::None: return "none";
    case ToolFormat::Hermes: return "hermes";
    case ToolFormat::Llama3: return "llama3";
    case ToolFormat::Mistral: return "mistral";
    case ToolFormat::Harmony: return "harmony";
    case ToolFormat::DeepSeek: return "deepseek";
    case ToolFormat::Granite: return "granite";
    case ToolFormat::Functionary: return "functionary";
  }
  return "?";
}

ToolFormat tool_format_of(const std::string& t) {
  auto has = [&](const char* s) { return t.find(s) != std::string::npos; };
  // gpt-oss's own template writes "to=" and "functions." in separate pieces.
  if (has("<|channel|>") && (has("to=functions") || (has(" to=") && has("functions.")))) return ToolFormat::Harmony;
  if (has("<｜tool▁calls▁begin｜>")) return ToolFormat::DeepSeek;
  if (has("[TOOL_CALLS]")) return ToolFormat::Mistral;
  if (has("<|tool_call|>")) return ToolFormat::Granite;
  if (has("<tool_call>")) return ToolFormat::Hermes;
  // Functionary v3.1: <function=NAME>{json}</function>, outside any
  // <tool_call> (where Qwen's XML form of it lives, above).
  if (has("<function=") && has("</function>")) return ToolFormat::Functionary;
  if (has("<|python_tag|>") || (has("<|start_header_id|>") && has("tools"))) return ToolFormat::Llama3;
  return ToolFormat::None;
}

ToolCallParser::ToolCallParser(ToolFormat f, std::string id_prefix) : f_(f), prefix_(std::move(id_prefix)) {}

void ToolCallParser::emit_content(std::string_view s, ToolParse& out) {
  out.content += s;
  if (!trim(s).empty()) started_ = true;
}

// The text of one region (after its start marker, before its end) as calls.
bool ToolCallParser::parse_region(std::string_view body, ToolParse& out) {
  std::vector<ToolCall> calls;
  body = trim(body);
  switch (f_) {
    case ToolFormat::Hermes: {
      if (auto x = xml_call(body)) calls.push_back(*x);
      else if (auto j = parse_json(body); !j || !calls_of(*j, calls)) return false;
      break;
    }
    case ToolFormat::Llama3: {
      // One call, or several separated by ';'.
      size_t at = 0;
      while (at <= body.size()) {
        const size_t semi = body.find(';', at);
        auto j = parse_json(body.substr(at, semi == std::string_view::npos ? std::string_view::npos : semi - at));
        if (!j || !calls_of(*j, calls)) return false;
        if (semi == std::string_view::npos) break;
        at = semi + 1;
      }
      break;
    }
    case ToolFormat::Mistral: {
      if (!body.empty() && body.front() == '[') {
        auto j = parse_json(body);
        if (!j || !calls_of(*j, calls)) return false;
      } else {  // N[ARGS]{...}
        const size_t a = body.find("[ARGS]");
        if (a == std::string_view::npos) return false;
        auto j = parse_json(body.substr(a + 6));
        if (!j || !j->is_object()) return false;
        calls.push_back({"", std::string(trim(body.substr(0, a))), j->dump()});
      }
      break;
    }
    case ToolFormat::DeepSeek: {
      for (size_t at = 0;;) {
        const size_t sep = body.find("<｜tool▁sep｜>", at);
        if (sep == std::string_view::npos) break;
        const size_t nl = body.find('\n', sep);
        const size_t j0 = body.find("```json", nl), j1 = body.find("```", j0 + 7);
        if (nl == std::string_view::npos || j0 == std::string_view::npos || j1 == std::string_view::npos) return false;
        auto j = parse_json(body.substr(j0 + 7, j1 - j0 - 7));
        if (!j || !j->is_object()) return false;
        const size_t name_at = sep + std::string("<｜tool▁sep｜>").size();
        const std::string_view name = trim(body.substr(name_at, nl - name_at));
        calls.push_back({"", std::string(name), j->dump()});
        at = j1 + 3;
      }
      if (calls.empty()) return false;
      break;
    }
    case ToolFormat::Granite: {
      auto j = parse_json(body);
      if (!j || !calls_of(*j, calls)) return false;
      break;
    }
    case ToolFormat::Functionary: {  // NAME>{json}
      const size_t gt = body.find('>');
      if (gt == std::string_view::npos || gt == 0) return false;
      auto j = parse_json(body.substr(gt + 1));
      if (!j || !j->is_object()) return false;
      calls.push_back({"", std::string(trim(body.substr(0, gt))), j->dump()});
      break;
    }
    default: return false;
  }
  for (ToolCall& c : calls) {
    if (c.id.empty()) c.id = prefix_ + std::to_string(n_calls_);
    ++n_calls_;
    out.calls.push_back(std::move(c));
  }
  return true;
}

namespace {

// The longest suffix of `s` that is a proper prefix of one of `marks`:
// text that must wait (it may become a marker).
size_t held_suffix(std::string_view s, const std::vector<std::string>& marks) {
  size_t keep = 0;
  for (const std::string& m : marks)
    for (size_t k = std::min(m.size() - 1, s.size()); k > keep; --k)
      if (s.substr(s.size() - k) == std::string_view(m).substr(0, k)) {
        keep = k;
        break;
      }
  return keep;
}

size_t find_first(std::string_view s, const std::vector<std::string>& marks, size_t from, size_t* len) {
  size_t best = std::string_view::npos;
  for (const std::string& m : marks) {
    const size_t p = s.find(m, from);
    if (p < best) {
      best = p;
      *len = m.size();
    }
  }
  return best;
}

}  // namespace

// A call region starts at buf_[0] (its start marker). Complete (its end
// marker, the next start, or the end of generation): parsed into calls, or
// content when it does not parse. False while it may still grow.
bool ToolCallParser::region(bool final, ToolParse& out) {
  const Markers m = markers(f_);
  size_t start_len = 0;
  find_first(buf_, m.start, 0, &start_len);
  size_t end = std::string::npos, end_len = 0;
  if (!m.end.empty()) {
    end = buf_.find(m.end, start_len);
    end_len = m.end.size();
  } else {
    end = find_first(buf_, m.start, start_len, &end_len);
    end_len = 0;  // the next region's start stays
  }
  if (end == std::string::npos && !final) return false;
  if (end == std::string::npos) end = buf_.size();
  const std::string raw = buf_.substr(0, end + end_len);
  if (!parse_region(std::string_view(buf_).substr(start_len, end - start_len), out)) emit_content(raw, out);
  buf_.erase(0, end + end_len);
  return true;
}

ToolParse ToolCallParser::scan(bool final) {
  ToolParse out;
  if (f_ == ToolFormat::None) {
    emit_content(buf_, out);
    buf_.clear();
    return out;
  }
  const Markers m = markers(f_);
  while (!buf_.empty()) {
    // Llama 3.x may answer with a bare call: a reply that starts with '{'
    // waits for its end to be judged.
    if (f_ == ToolFormat::Llama3 && !started_ && trim(buf_).substr(0, 1) == "{") {
      if (!final) break;
      if (!parse_region(buf_, out)) emit_content(buf_, out);
      buf_.clear();
      break;
    }
    size_t len = 0;
    const size_t at = find_first(buf_, m.start, 0, &len);
    if (at == 0) {
      if (!region(final, out)) break;
      continue;
    }
    if (at != std::string::npos) {
      emit_content(std::string_view(buf_).substr(0, at), out);
      buf_.erase(0, at);
      continue;
    }
    const size_t keep = final ? 0 : held_suffix(buf_, m.start);
    if (f_ == ToolFormat::Llama3 && !started_ && trim(buf_).empty() && !final) break;  // only whitespace yet
    emit_content(std::string_view(buf_).substr(0, buf_.size() - keep), out);
    buf_.erase(0, buf_.size() - keep);
    break;
  }
  return out;
}

// "<|channel|>commentary to=functions.N <|constrain|>json" (the recipient may
// also come before the channel).
void ToolCallParser::harmony_header(std::string_view h) {
  channel_.clear();
  recipient_.clear();
  const size_t c = h.find("<|channel|>");
  if (c != std::string_view::npos) {
    size_t e = c + 11;
    while (e < h.size() && h[e] != ' ' && h[e] != '<') ++e;
    channel_ = std::string(h.substr(c + 11, e - c - 11));
  }
  const size_t t = h.find("to=");
  if (t != std::string_view::npos) {
    size_t e = t + 3;
    while (e < h.size() && h[e] != ' ' && h[e] != '<') ++e;
    recipient_ = std::string(h.substr(t + 3, e - t - 3));
  }
}

void ToolCallParser::harmony_body(std::string_view piece, bool complete, ToolParse& out) {
  if (recipient_.rfind("functions.", 0) == 0) {
    call_body_ += piece;
    if (!complete) return;
    auto j = parse_json(call_body_);
    if (j && j->is_object()) {
      out.calls.push_back({prefix_ + std::to_string(n_calls_), recipient_.substr(10), j->dump()});
      ++n_calls_;
    } else {
      emit_content(call_body_, out);
    }
    call_body_.clear();
  } else if (channel_ == "analysis") {
    out.reasoning += piece;
  } else {
    emit_content(piece, out);
  }
}

ToolParse ToolCallParser::scan_harmony(bool final) {
  static const std::vector<std::string> kEnds = {"<|end|>", "<|start|>", "<|call|>", "<|return|>"};
  ToolParse out;
  while (!buf_.empty()) {
    if (!in_body_) {
      const size_t m = buf_.find("<|message|>");
      if (m == std::string::npos) {
        if (final) {  // a header without a body: shown as it is
          emit_content(buf_, out);
          buf_.clear();
        }
        break;
      }
      harmony_header(std::string_view(buf_).substr(0, m));
      buf_.erase(0, m + 11);
      in_body_ = true;
      continue;
    }
    size_t len = 0;
    const size_t e = find_first(buf_, kEnds, 0, &len);
    if (e != std::string::npos) {
      harmony_body(std::string_view(buf_).substr(0, e), true, out);
      // <|start|> opens the next message: its header follows.
      buf_.erase(0, e + (buf_.compare(e, 9, "<|start|>") == 0 ? 9 : len));
      in_body_ = false;
      continue;
    }
    const size_t keep = final ? 0 : held_suffix(buf_, kEnds);
    harmony_body(std::string_view(buf_).substr(0, buf_.size() - keep), false, out);
    buf_.erase(0, buf_.size() - keep);
    break;
  }
  if (final && in_body_) {  // generation ended inside a message (its end token is not text)
    harmony_body("", true, out);
    in_body_ = false;
  }
  return out;
}

ToolParse ToolCallParser::push(std::string_view text) {
  buf_ += text;
  return f_ == ToolFormat::Harmony ? scan_harmony(false) : scan(false);
}

ToolParse ToolCallParser::finish() { return f_ == ToolFormat::Harmony ? scan_harmony(true) : scan(true); }

}  // namespace kvs::server
