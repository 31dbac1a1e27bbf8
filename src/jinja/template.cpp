#include "jinja/template.h"

#include "jinja/interp.h"
#include "jinja/json_value.h"
#include "jinja/parser.h"

namespace kvs::jinja {

Template::Template(std::string_view source, std::string name) : name_(std::move(name)) {
  program_ = parse(tokenize(source, name_), name_);
}

std::string Template::render(const nlohmann::ordered_json& vars, const RenderOptions& options) const {
  if (!vars.is_object()) throw Error(ErrorKind::Render, "the template's variables must be a JSON object", 0, name_);
  std::function<std::tm()> clock = options.clock;
  if (!clock)
    clock = [] {
      const std::time_t now = std::time(nullptr);
      std::tm t{};
      localtime_r(&now, &t);
      return t;
    };
  try {
    auto globals = std::make_shared<Scope>(nullptr);
    for (const auto& [k, v] : vars.items()) globals->set(k, from_json(v));
    Interp in(name_, options.limits, std::move(clock));
    return in.render(*program_, globals);
  } catch (const Error&) {
    throw;
  } catch (const EvalError& e) {
    throw Error(e.kind(), e.what(), 0, name_);
  } catch (const std::bad_alloc&) {
    throw Error(ErrorKind::Limit, "out of memory while rendering", 0, name_);
  } catch (const std::exception& e) {
    throw Error(ErrorKind::Render, std::string("internal error: ") + e.what(), 0, name_);
  }
}

}  // namespace kvs::jinja
