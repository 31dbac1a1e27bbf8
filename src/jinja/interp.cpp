#include "jinja/interp.h"

#include "jinja/builtins.h"
#include "jinja/error.h"
#include "jinja/runtime_objects.h"
#include "jinja/value_ops.h"
#include "jinja/value_text.h"

namespace kvs::jinja {

const Value* Scope::find(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent.get())
    for (const auto& [k, v] : s->vars)
      if (k == name) return &v;
  return nullptr;
}

void Scope::set(const std::string& name, Value v) {
  for (auto& [k, x] : vars)
    if (k == name) {
      x = std::move(v);
      return;
    }
  vars.emplace_back(name, std::move(v));
}

// Nested macro calls and recursive loops, against Limits::max_call_depth.
struct Interp::DepthGuard {
  explicit DepthGuard(Interp& in) : in_(in) {
    if (++in_.depth_ > in_.limits().max_call_depth)
      throw EvalError("the render nested more than " + std::to_string(in_.limits().max_call_depth) +
                          " macro calls (Limits::max_call_depth)",
                      ErrorKind::Limit);
  }
  ~DepthGuard() { --in_.depth_; }
  Interp& in_;
};

Interp::Interp(const std::string& name, const Limits& limits, std::function<std::tm()> clock)
    : Ctx(limits), name_(name), clock_(std::move(clock)) {}

Interp::~Interp() {
  for (auto& w : adopted_)
    if (auto o = w.lock()) o->drop_refs();
}

void Interp::fail(const EvalError& e, int line) const { throw Error(e.kind(), e.what(), line, name_); }

std::string Interp::render(const Program& program, const ScopePtr& globals) {
  auto top = std::make_shared<Scope>(globals);
  std::string out;
  exec(program.body, top, out);
  return out;
}

void Interp::write(std::string& out, std::string_view text) {
  charge(text.size());
  if (out.size() + text.size() > limits().max_output_bytes)
    throw EvalError(
        "the render's output passed " + std::to_string(limits().max_output_bytes) + " bytes (Limits::max_output_bytes)",
        ErrorKind::Limit);
  out.append(text);
}

Flow Interp::exec(const Body& body, const ScopePtr& scope, std::string& out) {
  for (const StmtPtr& s : body) {
    const Flow f = exec_stmt(*s, scope, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

std::string Interp::capture(const Body& body, const ScopePtr& scope) {
  std::string out;
  exec(body, std::make_shared<Scope>(scope), out);
  return out;
}

Flow Interp::exec_stmt(const Stmt& s, const ScopePtr& scope, std::string& out) {
  try {
    step();
    switch (s.kind) {
      case Stmt::Kind::Text: write(out, static_cast<const TextStmt&>(s).text); break;
      case Stmt::Kind::Print: write(out, py_str(eval(*static_cast<const PrintStmt&>(s).expr, scope))); break;
      case Stmt::Kind::If: {
        const auto& i = static_cast<const IfStmt&>(s);
        for (const auto& [test, body] : i.branches)
          if (truthy(eval(*test, scope))) return exec(body, scope, out);
        return exec(i.otherwise, scope, out);
      }
      case Stmt::Kind::For: {
        const auto& f = static_cast<const ForStmt&>(s);
        exec_for(f, scope, out, eval(*f.iter, scope), 0);
        break;
      }
      case Stmt::Kind::Set: {
        const auto& a = static_cast<const SetStmt&>(s);
        assign(*a.target, eval(*a.value, scope), scope);
        break;
      }
      case Stmt::Kind::SetBlock: {
        const auto& a = static_cast<const SetBlockStmt&>(s);
        Value v(capture(a.body, scope));
        if (a.filter) v = apply_filter(static_cast<const FilterExpr&>(*a.filter), scope, &v);
        assign(*a.target, v, scope);
        break;
      }
      case Stmt::Kind::Macro: {
        const MacroDef& def = *static_cast<const MacroStmt&>(s).def;
        auto m = std::make_shared<MacroObj>(this, &def, scope);
        adopt(m);
        scope->set(def.name, Value::object(std::move(m)));
        break;
      }
      case Stmt::Kind::CallBlock: exec_call_block(static_cast<const CallBlockStmt&>(s), scope, out); break;
      case Stmt::Kind::FilterBlock: {
        const auto& f = static_cast<const FilterBlockStmt&>(s);
        auto inner = std::make_shared<Scope>(scope);
        std::string body;
        exec(f.body, inner, body);
        const Value v(std::move(body));
        write(out, py_str(apply_filter(static_cast<const FilterExpr&>(*f.filter), inner, &v)));
        break;
      }
      case Stmt::Kind::With: {
        const auto& w = static_cast<const WithStmt&>(s);
        auto inner = std::make_shared<Scope>(scope);
        for (const auto& [target, value] : w.assigns) assign(*target, eval(*value, scope), inner);
        return exec(w.body, inner, out);
      }
      case Stmt::Kind::Break: return Flow::Break;
      case Stmt::Kind::Continue: return Flow::Continue;
      case Stmt::Kind::Unsupported: throw EvalError(static_cast<const UnsupportedStmt&>(s).message);
    }
  } catch (const EvalError& e) {
    fail(e, s.line);
  }
  return Flow::Normal;
}

void Interp::assign(const Expr& target, const Value& v, const ScopePtr& scope) {
  if (target.kind == Expr::Kind::Name) {
    scope->set(static_cast<const NameExpr&>(target).name, v);
    return;
  }
  if (target.kind == Expr::Kind::NsRef) {
    const auto& r = static_cast<const NsRefExpr&>(target);
    const Value ns = lookup(r.name, scope);
    auto* n = ns.object_as<Namespace>();
    if (!n) throw EvalError("TemplateRuntimeError: cannot assign attribute on non-namespace object");
    n->set(r.attr, v);
    return;
  }
  const auto& names = static_cast<const ListExpr&>(target).items;
  const List items = to_list(*this, v);
  if (items.size() > names.size())
    throw EvalError("ValueError: too many values to unpack (expected " + std::to_string(names.size()) + ")");
  if (items.size() < names.size())
    throw EvalError("ValueError: not enough values to unpack (expected " + std::to_string(names.size()) + ", got " +
                    std::to_string(items.size()) + ")");
  for (size_t i = 0; i < names.size(); ++i) assign(*names[i], items[i], scope);
}

void Interp::exec_for(const ForStmt& f, const ScopePtr& scope, std::string& out, const Value& iterable, int depth) {
  Iter source = iterate(iterable);
  Iter fetch = source;
  if (f.filter) {
    // Each item is tested when the loop reaches it, in a scope of its own.
    fetch = [this, &f, scope, source]() -> std::optional<Value> {
      while (auto item = source()) {
        auto test_scope = std::make_shared<Scope>(scope);
        assign(*f.target, *item, test_scope);
        if (truthy(eval(*f.filter, test_scope))) return item;
      }
      return std::nullopt;
    };
  }
  auto loop = std::make_shared<LoopObj>(this, fetch, &f, scope, depth);
  adopt(loop);
  const Value loop_value = Value::object(loop);
  bool any = false;
  while (auto item = loop->advance()) {
    any = true;
    iteration();
    auto it_scope = std::make_shared<Scope>(scope);
    assign(*f.target, *item, it_scope);
    it_scope->set("loop", loop_value);
    if (exec(f.body, it_scope, out) == Flow::Break) break;
  }
  if (!any) exec(f.otherwise, std::make_shared<Scope>(scope), out);
}

std::string Interp::run_loop(const ForStmt& f, const ScopePtr& scope, const Value& iterable, int depth) {
  DepthGuard g(*this);
  std::string out;
  exec_for(f, scope, out, iterable, depth);
  return out;
}

void Interp::exec_call_block(const CallBlockStmt& c, const ScopePtr& scope, std::string& out) {
  auto caller = std::make_shared<MacroObj>(this, c.caller.get(), scope);
  adopt(caller);
  const Value cv = Value::object(std::move(caller));
  write(out, py_str(eval_call(static_cast<const CallExpr&>(*c.call), scope, &cv)));
}

Value Interp::call_macro(const MacroDef& def, const ScopePtr& closure, Args args) {
  DepthGuard g(*this);
  auto scope = std::make_shared<Scope>(closure);
  const size_t n = def.params.size();
  if (args.pos.size() > n && !def.uses_varargs)
    type_error("macro '" + def.name + "' takes not more than " + std::to_string(n) + " argument(s)");
  std::vector<bool> bound(n, false);
  for (size_t i = 0; i < n && i < args.pos.size(); ++i) {
    scope->set(def.params[i], args.pos[i]);
    bound[i] = true;
  }
  Dict extra_kw;
  Value caller = Value::undefined("No caller defined");
  for (auto& [k, v] : args.kw) {
    size_t i = 0;
    while (i < n && def.params[i] != k) ++i;
    if (i < n) {
      if (bound[i]) type_error("macro '" + def.name + "' got multiple values for argument '" + k + "'");
      scope->set(k, v);
      bound[i] = true;
    } else if (k == "caller" && def.uses_caller) {
      caller = v;
    } else if (def.uses_kwargs) {
      extra_kw.set(Value(k), v);
    } else {
      type_error("macro '" + def.name + "' takes no keyword argument '" + k + "'");
    }
  }
  const size_t first_default = n - def.defaults.size();
  for (size_t i = 0; i < n; ++i) {
    if (bound[i]) continue;
    scope->set(def.params[i], i >= first_default
                                  ? eval(*def.defaults[i - first_default], scope)
                                  : Value::undefined("parameter '" + def.params[i] + "' was not provided"));
  }
  if (def.uses_varargs)
    scope->set("varargs",
               Value::tuple(args.pos.size() > n ? List(args.pos.begin() + long(n), args.pos.end()) : List{}));
  if (def.uses_kwargs) scope->set("kwargs", Value::dict(std::move(extra_kw)));
  if (def.uses_caller) scope->set("caller", caller);
  std::string out;
  exec(def.body, scope, out);
  return Value(std::move(out));
}

Value Interp::lookup(const std::string& name, const ScopePtr& scope) const {
  if (const Value* v = scope->find(name)) return *v;
  if (const Value* b = find_builtin(name)) return *b;
  return Value::undefined("'" + name + "' is undefined");
}

}  // namespace kvs::jinja
