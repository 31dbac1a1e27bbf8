// Filters on sequences and mappings. Those that are generators in Jinja2
// return Generator values pulling lazily from their input.
#include "jinja/filters_seq.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <unordered_map>

#include "jinja/args.h"
#include "jinja/error.h"
#include "jinja/methods.h"
#include "jinja/predicates.h"
#include "jinja/str_ops.h"
#include "jinja/unicode.h"
#include "jinja/value_ops.h"
#include "jinja/value_text.h"

namespace kvs::jinja {

Value attr_path(const Value& v, const std::string& path, const Value* dflt) {
  Value item = v;
  for (const std::string& part : pystr::split(path, std::string("."), -1)) {
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c));
    });
    item = get_item(item, digits ? Value(int64_t(std::stoll(part))) : Value(part));
    if (dflt && item.is_undefined()) item = *dflt;
  }
  return item;
}

namespace {

Value generator(Generator::Next next) { return Value::object(std::make_shared<Generator>(std::move(next))); }

// A Python generator function's result: its body (checks included) runs
// only when the first item is pulled. `start` returns the item source
// (empty for none).
Value lazy(std::function<Iter()> start) {
  auto source = std::make_shared<Iter>();
  auto started = std::make_shared<bool>(false);
  return generator([start = std::move(start), source, started]() -> std::optional<Value> {
    if (!*started) {
      *started = true;
      *source = start();
    }
    return *source ? (*source)() : std::nullopt;
  });
}

// A key getter: an attribute path (or an integer index), lower-cased for
// case-insensitive comparisons when asked.
Value key_of(const Value& item, const Value* attribute, bool ignore_case, const Value* dflt = nullptr) {
  Value k = item;
  if (attribute && !attribute->is_none()) {
    if (attribute->is_integral()) {
      k = get_item(item, *attribute);
      if (dflt && k.is_undefined()) k = *dflt;
    } else {
      k = attr_path(item, py_str(*attribute), dflt);
    }
  }
  if (ignore_case && k.is_string())
    return k.is_markup() ? Value::markup(uni::to_lower(k.str())) : Value(uni::to_lower(k.str()));
  return k;
}

Value f_length(Ctx&, const Value& v, const Args& a) {
  no_args("length", a);
  return Value(int64_t(py_len(v)));
}

Value f_first(Ctx&, const Value& v, const Args& a) {
  no_args("first", a);
  Iter it = iterate(v);
  if (auto x = it()) return *x;
  return Value::undefined("No first item, sequence was empty.");
}

Value f_last(Ctx&, const Value& v, const Args& a) {
  no_args("last", a);
  if (v.is_list() && !v.items().empty()) return v.items().back();
  if (v.is_dict() && v.dict().size()) return v.dict().entries.back().first;
  if (v.is_string() && !v.str().empty()) {
    const std::vector<char32_t> cps = uni::decode(v.str());
    std::string s;
    uni::append(s, cps.back());
    return Value(std::move(s));
  }
  if (v.is_list() || v.is_dict() || v.is_string() || v.is_undefined())
    return Value::undefined("No last item, sequence was empty.");
  type_error("'" + type_name(v) + "' object is not reversible");
}

Value f_list(Ctx& ctx, const Value& v, const Args& a) {
  no_args("list", a);
  return Value::list(to_list(ctx, v));
}

Value f_join(Ctx& ctx, const Value& v, const Args& a) {
  ArgReader r("join", a, {"d", "attribute"});
  const std::string sep = r.has(0) ? py_str(*r.get(0)) : "";
  std::string out;
  Iter it = iterate(v);
  bool first = true;
  while (auto x = it()) {
    if (!first) out += sep;
    first = false;
    const std::string piece = py_str(r.has(1) ? key_of(*x, r.get(1), false) : *x);
    ctx.charge(piece.size() + sep.size());
    out += piece;
  }
  return Value(std::move(out));
}

Value f_items(Ctx&, const Value& v, const Args& a) {
  no_args("items", a);
  return lazy([v]() -> Iter {
    if (v.is_undefined()) return {};
    if (!v.is_dict()) type_error("Can only get item pairs from a mapping.");
    return [v, i = size_t(0)]() mutable -> std::optional<Value> {
      if (i >= v.dict().entries.size()) return std::nullopt;
      const auto& e = v.dict().entries[i++];
      return Value::tuple({e.first, e.second});
    };
  });
}

Value f_dictsort(Ctx& ctx, const Value& v, const Args& a) {
  ArgReader r("dictsort", a, {"case_sensitive", "by", "reverse"});
  const std::string by = r.str_or(1, "key");
  if (by != "key" && by != "value")
    throw EvalError("FilterArgumentError: You can only sort by either 'key' or 'value'");
  if (!v.is_dict()) throw EvalError("AttributeError: '" + type_name(v) + "' object has no attribute 'items'");
  const bool ci = !r.bool_or(0, false), rev = r.bool_or(2, false);
  const size_t pos = by == "key" ? 0 : 1;
  List items;
  for (const auto& [k, x] : v.dict().entries) items.push_back(Value::tuple({k, x}));
  ctx.charge(items.size() * 3 * sizeof(Value));
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    const Value kx = key_of(x.items()[pos], nullptr, ci), ky = key_of(y.items()[pos], nullptr, ci);
    return rev ? py_less(ky, kx) : py_less(kx, ky);
  });
  return Value::list(std::move(items));
}

Value f_sort(Ctx& ctx, const Value& v, const Args& a) {
  ArgReader r("sort", a, {"reverse", "case_sensitive", "attribute"});
  const bool rev = r.bool_or(0, false), ci = !r.bool_or(1, false);
  List items = to_list(ctx, v);
  std::vector<std::string> attrs;
  if (const Value* at = r.get(2); at && !at->is_none()) {
    if (at->is_integral())
      attrs.push_back(py_str(*at));
    else
      for (const std::string& s : pystr::split(py_str(*at), std::string(","), -1))
        attrs.push_back(pystr::strip(s, std::nullopt));
  }
  auto key = [&](const Value& x) {
    if (attrs.empty()) return key_of(x, nullptr, ci);
    List parts;
    for (const std::string& p : attrs) {
      const Value pv(p);
      parts.push_back(key_of(x, &pv, ci));
    }
    return attrs.size() == 1 ? parts[0] : Value::list(std::move(parts));
  };
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& x : items) keyed.emplace_back(key(x), std::move(x));
  ctx.charge(keyed.size() * 2 * sizeof(Value));
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return rev ? py_less(y.first, x.first) : py_less(x.first, y.first);
  });
  List out;
  for (auto& [k, x] : keyed) out.push_back(std::move(x));
  return Value::list(std::move(out));
}

Value f_reverse(Ctx& ctx, const Value& v, const Args&) {
  if (v.is_string()) {
    std::vector<char32_t> cps = uni::decode(v.str());
    std::reverse(cps.begin(), cps.end());
    return v.is_markup() ? Value::markup(uni::encode(cps)) : Value(uni::encode(cps));
  }
  if (v.is_list() || v.is_dict() || v.is_undefined()) {
    List items = to_list(ctx, v);
    const size_t n = items.size();
    return generator([items = std::move(items), i = n]() mutable -> std::optional<Value> {
      if (i == 0) return std::nullopt;
      return items[--i];
    });
  }
  List items = to_list(ctx, v);  // not reversible: Jinja2 falls back to a reversed list
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_unique(Ctx& ctx, const Value& v, const Args& a) {
  ArgReader r("unique", a, {"case_sensitive", "attribute"});
  const bool ci = !r.bool_or(0, false);
  const Value attribute = r.get_or(1, Value::none());
  Ctx* c = &ctx;
  return lazy([v, ci, attribute, c]() -> Iter {
    auto seen = std::make_shared<List>();
    Iter it = iterate(v);
    return [it, seen, ci, attribute, c]() -> std::optional<Value> {
      while (auto x = it()) {
        const Value k = key_of(*x, &attribute, ci);
        if (k.is_list() && !k.is_tuple()) type_error("unhashable type: 'list'");
        if (k.is_dict()) type_error("unhashable type: 'dict'");
        if (std::any_of(seen->begin(), seen->end(), [&](const Value& s) { return py_equal(s, k); })) continue;
        c->charge(sizeof(Value));
        seen->push_back(k);
        return x;
      }
      return std::nullopt;
    };
  });
}

// select / reject / selectattr / rejectattr: Jinja2's select_or_reject.
Value select_or_reject(Ctx& ctx, const Value& v, const Args& a, bool keep, bool by_attr) {
  Ctx* c = &ctx;
  return lazy([=]() -> Iter {
    if (!truthy(v)) return {};
    Args rest = a;
    std::optional<Value> attribute;
    if (by_attr) {
      if (rest.pos.empty()) throw EvalError("FilterArgumentError: Missing parameter for attribute name");
      attribute = rest.pos.front();
      rest.pos.erase(rest.pos.begin());
    }
    std::optional<std::string> test;
    if (!rest.pos.empty()) {
      test = py_str(rest.pos.front());
      rest.pos.erase(rest.pos.begin());
    }
    Iter it = iterate(v);
    return [=]() -> std::optional<Value> {
      while (auto x = it()) {
        c->step();
        const Value subject = attribute ? key_of(*x, &*attribute, false) : *x;
        const bool ok = test ? c->test(*test, subject, rest) : truthy(subject);
        if (ok == keep) return x;
      }
      return std::nullopt;
    };
  });
}

Value f_map(Ctx& ctx, const Value& v, const Args& a) {
  Ctx* c = &ctx;
  return lazy([=]() -> Iter {
    if (!truthy(v)) return {};
    Iter it = iterate(v);
    if (a.pos.empty() && std::any_of(a.kw.begin(), a.kw.end(), [](const auto& k) { return k.first == "attribute"; })) {
      Value attribute, dflt = Value::none();
      for (const auto& [k, x] : a.kw) {
        if (k == "attribute")
          attribute = x;
        else if (k == "default")
          dflt = x;
        else
          throw EvalError("FilterArgumentError: Unexpected keyword argument '" + k + "'");
      }
      return [=]() -> std::optional<Value> {
        auto x = it();
        if (!x) return std::nullopt;
        return key_of(*x, &attribute, false, dflt.is_none() ? nullptr : &dflt);
      };
    }
    if (a.pos.empty()) throw EvalError("FilterArgumentError: map requires a filter argument");
    const std::string name = py_str(a.pos[0]);
    Args rest = a;
    rest.pos.erase(rest.pos.begin());
    return [=]() -> std::optional<Value> {
      auto x = it();
      if (!x) return std::nullopt;
      return c->filter(name, *x, rest);
    };
  });
}

Value min_max(Ctx& ctx, const Value& v, const Args& a, bool want_max) {
  ArgReader r(want_max ? "max" : "min", a, {"case_sensitive", "attribute"});
  const bool ci = !r.bool_or(0, false);
  const List items = to_list(ctx, v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = key_of(items[0], r.get(1), ci);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key_of(items[i], r.get(1), ci);
    if (want_max ? py_less(best_key, k) : py_less(k, best_key)) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}

Value f_sum(Ctx& ctx, const Value& v, const Args& a) {
  ArgReader r("sum", a, {"attribute", "start"});
  Value total = r.get_or(1, Value(int64_t(0)));
  Iter it = iterate(v);
  while (auto x = it())
    total = binary(ctx, BinOp::Add, total, r.has(0) && !r.get(0)->is_none() ? key_of(*x, r.get(0), false) : *x);
  return total;
}

Value f_batch(Ctx& ctx, const Value& v, const Args& a) {
  ArgReader r("batch", a, {"linecount", "fill_with"});
  const int64_t n = r.int_or(0, 0);
  if (n <= 0) throw EvalError("ValueError: batch linecount must be positive");
  const Value fill = r.get_or(1, Value::none());
  Ctx* c = &ctx;
  auto source = std::make_shared<Iter>();
  return generator([=]() -> std::optional<Value> {
    if (!*source) *source = iterate(v);
    Iter& it = *source;
    List tmp;
    while (int64_t(tmp.size()) < n) {
      auto x = it();
      if (!x) break;
      c->charge(sizeof(Value));
      tmp.push_back(std::move(*x));
    }
    if (tmp.empty()) return std::nullopt;
    if (!fill.is_none())
      while (int64_t(tmp.size()) < n) tmp.push_back(fill);
    return Value::list(std::move(tmp));
  });
}

Value f_attr(Ctx&, const Value& v, const Args& a) {
  ArgReader r("attr", a, {"name"});
  const std::string name = r.has(0) ? py_str(*r.get(0)) : "";
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_object())
    if (auto x = v.object()->attr(name)) return *x;
  if (auto m = method_of(v, name)) return *m;
  return Value::undefined("'" + object_type_repr(v) + "' has no attribute '" + name + "'");
}

using Table = std::unordered_map<std::string, FilterFn>;

const Table& seq_filters() {
  static const Table t = {
      {"length", f_length},
      {"count", f_length},
      {"first", f_first},
      {"last", f_last},
      {"list", f_list},
      {"join", f_join},
      {"items", f_items},
      {"dictsort", f_dictsort},
      {"sort", f_sort},
      {"reverse", f_reverse},
      {"unique", f_unique},
      {"map", f_map},
      {"sum", f_sum},
      {"batch", f_batch},
      {"attr", f_attr},
      {"select", [](Ctx& c, const Value& v, const Args& a) { return select_or_reject(c, v, a, true, false); }},
      {"reject", [](Ctx& c, const Value& v, const Args& a) { return select_or_reject(c, v, a, false, false); }},
      {"selectattr", [](Ctx& c, const Value& v, const Args& a) { return select_or_reject(c, v, a, true, true); }},
      {"rejectattr", [](Ctx& c, const Value& v, const Args& a) { return select_or_reject(c, v, a, false, true); }},
      {"min", [](Ctx& c, const Value& v, const Args& a) { return min_max(c, v, a, false); }},
      {"max", [](Ctx& c, const Value& v, const Args& a) { return min_max(c, v, a, true); }},
  };
  return t;
}

}  // namespace

FilterFn find_seq_filter(const std::string& name) {
  auto it = seq_filters().find(name);
  return it == seq_filters().end() ? nullptr : it->second;
}

}  // namespace kvs::jinja
