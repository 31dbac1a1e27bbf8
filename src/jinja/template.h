// A Jinja template engine for chat templates: Jinja2's syntax and
// semantics as Hugging Face transformers sets Jinja2 up for
// apply_chat_template (ImmutableSandboxedEnvironment, trim_blocks,
// lstrip_blocks, loop controls, HF's tojson, raise_exception and
// strftime_now). docs/SERVER.md ("Chat templates") lists what is covered.
//
//   jinja::Template t(source, "tokenizer.chat_template");   // throws jinja::Error (Syntax)
//   std::string text = t.render(vars);                       // throws jinja::Error
//
// A parsed Template is immutable: any number of threads may render it at
// once. Every render is bounded (Limits).
#pragma once
#include <ctime>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "jinja/ctx.h"
#include "jinja/error.h"

namespace kvs::jinja {

struct Program;

struct RenderOptions {
  Limits limits;
  // The time strftime_now formats; empty = the local time now.
  std::function<std::tm()> clock;
};

class Template {
 public:
  // Parses `source`; throws Error (Syntax) with the line. `name` names the
  // template in error messages.
  explicit Template(std::string_view source, std::string name = "template");
  // Renders with the variables of `vars` (a JSON object; key order is kept,
  // as tojson shows). Throws Error (Render, Raised or Limit) with the line.
  std::string render(const nlohmann::ordered_json& vars, const RenderOptions& options = {}) const;
  const std::string& name() const { return name_; }

 private:
  std::shared_ptr<const Program> program_;
  std::string name_;
};

}  // namespace kvs::jinja
