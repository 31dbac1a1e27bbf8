#include "jinja/runtime_objects.h"

#include "jinja/error.h"
#include "jinja/value_ops.h"

namespace kvs::jinja {

Value MacroObj::call(Ctx&, Args args) {
  if (!closure_)
    throw EvalError("TemplateRuntimeError: the macro '" + def_->name + "' was used after its render ended");
  return in_->call_macro(*def_, closure_, std::move(args));
}

std::optional<Value> MacroObj::attr(const std::string& name) const {
  if (name == "name") return Value(def_->name);
  if (name == "arguments") {
    List l;
    for (const auto& p : def_->params) l.push_back(Value(p));
    return Value::tuple(std::move(l));
  }
  if (name == "catch_kwargs") return Value(def_->uses_kwargs);
  if (name == "catch_varargs") return Value(def_->uses_varargs);
  if (name == "caller") return Value(def_->uses_caller);
  return std::nullopt;
}

std::optional<Value> LoopObj::advance() {
  std::optional<Value> v;
  if (!ahead_.empty()) {
    v = std::move(ahead_.front());
    ahead_.pop_front();
  } else if (fetch_) {
    v = fetch_();
  }
  if (!v) return std::nullopt;
  prev_ = current_;
  current_ = *v;
  ++index0_;
  return v;
}

bool LoopObj::peek() const {
  if (ahead_.empty() && fetch_)
    if (auto v = fetch_()) ahead_.push_back(std::move(*v));
  return !ahead_.empty();
}

int64_t LoopObj::length() const {
  while (fetch_) {
    auto v = fetch_();
    if (!v) break;
    in_->charge(sizeof(Value));
    ahead_.push_back(std::move(*v));
  }
  return index0_ + 1 + int64_t(ahead_.size());
}

std::optional<Value> LoopObj::attr(const std::string& name) const {
  if (name == "index0") return Value(index0_);
  if (name == "index") return Value(index0_ + 1);
  if (name == "first") return Value(index0_ == 0);
  if (name == "last") return Value(!peek());
  if (name == "length") return Value(length());
  if (name == "revindex") return Value(length() - index0_);
  if (name == "revindex0") return Value(length() - index0_ - 1);
  if (name == "depth") return Value(int64_t(depth_ + 1));
  if (name == "depth0") return Value(int64_t(depth_));
  if (name == "previtem") return index0_ > 0 ? prev_ : Value::undefined("there is no previous item");
  if (name == "nextitem") return peek() ? ahead_.front() : Value::undefined("there is no next item");
  if (name == "cycle") {
    const int64_t i = index0_;
    return make_function("cycle", [i](Ctx&, Args& a) {
      if (a.pos.empty()) type_error("no items for cycling given");
      return a.pos[size_t(i % int64_t(a.pos.size()))];
    });
  }
  if (name == "changed") {
    auto last = last_changed_;
    return make_function("changed", [last](Ctx&, Args& a) {
      if (*last && last->value().size() == a.pos.size()) {
        bool same = true;
        for (size_t i = 0; i < a.pos.size() && same; ++i) same = py_equal((**last)[i], a.pos[i]);
        if (same) return Value(false);
      }
      *last = a.pos;
      return Value(true);
    });
  }
  return std::nullopt;
}

Value LoopObj::call(Ctx&, Args args) {
  if (!for_->recursive) type_error("The loop must be marked as 'recursive' to call it.");
  if (args.pos.size() != 1 || !args.kw.empty()) type_error("loop() takes exactly one argument");
  if (!scope_) throw EvalError("TemplateRuntimeError: the loop was called after its render ended");
  return Value(in_->run_loop(*for_, scope_, args.pos[0], depth_ + 1));
}

std::string LoopObj::repr() const {
  return "<LoopContext " + std::to_string(index0_ + 1) + "/" + std::to_string(length()) + ">";
}

void LoopObj::drop_refs() {
  scope_.reset();
  fetch_ = nullptr;
  ahead_.clear();
  prev_ = current_ = Value();
}

}  // namespace kvs::jinja
