#include "jinja/builtins.h"

#include <ctime>
#include <unordered_map>

#include "jinja/args.h"
#include "jinja/ctx.h"
#include "jinja/error.h"
#include "jinja/value_ops.h"
#include "jinja/value_text.h"

namespace kvs::jinja {

namespace {

constexpr int64_t kMaxRange = 100000;  // the sandbox's MAX_RANGE

int64_t index_arg(const Value& v) {
  if (!v.is_integral()) type_error("'" + type_name(v) + "' object cannot be interpreted as an integer");
  return v.as_int();
}

Value b_range(Ctx& ctx, Args& a) {
  if (!a.kw.empty()) type_error("range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3)
    type_error("range expected 1 to 3 arguments, got " + std::to_string(a.pos.size()));
  int64_t start = 0, stop, step = 1;
  if (a.pos.size() == 1) {
    stop = index_arg(a.pos[0]);
  } else {
    start = index_arg(a.pos[0]);
    stop = index_arg(a.pos[1]);
    if (a.pos.size() == 3) step = index_arg(a.pos[2]);
  }
  if (step == 0) throw EvalError("ValueError: range() arg 3 must not be zero");
  const long double span = step > 0 ? (long double)stop - start : (long double)start - stop;
  const long double n = span <= 0 ? 0 : (span + (long double)(step > 0 ? step : -step) - 1) / (step > 0 ? step : -step);
  if (n > kMaxRange)
    throw EvalError("OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  List out;
  ctx.charge(uint64_t(n) * sizeof(Value));
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(Value(i));
  return Value::list(std::move(out));
}

// dict(*args, **kwargs), which namespace() takes as well.
Dict dict_args(Ctx& ctx, const Args& a, const char* fn) {
  if (a.pos.size() > 1)
    type_error(std::string(fn) + " expected at most 1 argument, got " + std::to_string(a.pos.size()));
  Dict d;
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.is_dict()) {
      d = src.dict();
    } else {
      for (const Value& pair : to_list(ctx, src)) {
        const List kv = to_list(ctx, pair);
        if (kv.size() != 2)
          throw EvalError("ValueError: dictionary update sequence element has length " + std::to_string(kv.size()) +
                          "; 2 is required");
        d.set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [k, v] : a.kw) d.set(Value(k), v);
  return d;
}

Value b_namespace(Ctx& ctx, Args& a) {
  auto ns = std::make_shared<Namespace>();
  ns->attrs = dict_args(ctx, a, "namespace");
  ctx.adopt(ns);
  return Value::object(std::move(ns));
}

Value b_joiner(Ctx&, Args& a) {
  ArgReader r("joiner", a, {"sep"});
  const Value sep = r.get_or(0, Value(", "));
  auto used = std::make_shared<bool>(false);
  return make_function(
      "joiner",
      [sep, used](Ctx&, Args&) {
        if (!*used) {
          *used = true;
          return Value("");
        }
        return sep;
      },
      "Joiner");
}

class Cycler : public Object {
 public:
  explicit Cycler(List items) : items_(std::move(items)) {}
  std::string type_name() const override { return "Cycler"; }
  std::optional<Value> attr(const std::string& name) const override {
    if (name == "current") return items_[*pos_];
    auto pos = pos_;
    const List items = items_;
    if (name == "next")
      return make_function("next", [pos, items](Ctx&, Args&) {
        const Value v = items[*pos];
        *pos = (*pos + 1) % items.size();
        return v;
      });
    if (name == "reset")
      return make_function("reset", [pos](Ctx&, Args&) {
        *pos = 0;
        return Value::none();
      });
    return std::nullopt;
  }

 private:
  List items_;
  std::shared_ptr<size_t> pos_ = std::make_shared<size_t>(0);
};

Value b_cycler(Ctx&, Args& a) {
  if (a.pos.empty()) type_error("at least one item has to be provided");
  return Value::object(std::make_shared<Cycler>(a.pos));
}

Value b_raise_exception(Ctx&, Args& a) {
  if (a.pos.size() != 1) type_error("raise_exception() takes exactly one argument");
  throw EvalError(py_str(a.pos[0]), ErrorKind::Raised);
}

Value b_strftime_now(Ctx& ctx, Args& a) {
  ArgReader r("strftime_now", a, {"format"});
  if (!r.has(0)) type_error("strftime_now() missing 1 required positional argument: 'format'");
  const std::string fmt = r.str_or(0, "");
  const std::tm t = ctx.now();
  for (size_t cap = 256; cap <= 65536; cap *= 4) {
    std::string buf(cap, '\0');
    const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &t);
    if (n > 0 || fmt.empty()) return Value(buf.substr(0, n));
  }
  return Value("");
}

}  // namespace

const Value* find_builtin(const std::string& name) {
  static const std::unordered_map<std::string, Value> g = {
      {"range", make_function("range", b_range, "type")},
      {"dict", make_function(
                   "dict", [](Ctx& c, Args& a) { return Value::dict(dict_args(c, a, "dict")); }, "type")},
      {"namespace", make_function("namespace", b_namespace, "type")},
      {"joiner", make_function("joiner", b_joiner, "type")},
      {"cycler", make_function("cycler", b_cycler, "type")},
      {"raise_exception", make_function("raise_exception", b_raise_exception)},
      {"strftime_now", make_function("strftime_now", b_strftime_now)},
  };
  auto it = g.find(name);
  return it == g.end() ? nullptr : &it->second;
}

}  // namespace kvs::jinja
