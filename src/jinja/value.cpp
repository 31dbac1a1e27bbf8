#include "jinja/value.h"

#include "jinja/error.h"
#include "jinja/value_ops.h"
#include "jinja/value_text.h"

namespace kvs::jinja {

namespace {
const std::string kEmpty;
const List kNoItems;
const Dict kNoDict;
}  // namespace

const Value* Dict::find(const Value& key) const {
  for (const auto& [k, v] : entries)
    if (py_equal(k, key)) return &v;
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k.is_string() && k.str() == key) return &v;
  return nullptr;
}

void Dict::set(Value key, Value value) {
  for (auto& [k, v] : entries)
    if (py_equal(k, key)) {
      v = std::move(value);
      return;
    }
  entries.emplace_back(std::move(key), std::move(value));
}

Value Value::undefined(std::string hint, bool unsafe) {
  Value v;
  v.flag_ = unsafe;
  if (!hint.empty()) v.p_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::none() {
  Value v;
  v.type_ = Type::None;
  return v;
}

Value::Value(std::string s) : type_(Type::String), p_(std::make_shared<const std::string>(std::move(s))) {}

Value Value::markup(std::string s) {
  Value v(std::move(s));
  v.flag_ = true;
  return v;
}

Value Value::list(List items) {
  Value v;
  v.type_ = Type::List;
  v.p_ = std::make_shared<const List>(std::move(items));
  return v;
}

Value Value::tuple(List items) {
  Value v = list(std::move(items));
  v.flag_ = true;
  return v;
}

Value Value::dict(Dict d) {
  Value v;
  v.type_ = Type::Dict;
  v.p_ = std::make_shared<const Dict>(std::move(d));
  return v;
}

Value Value::object(std::shared_ptr<Object> o) {
  Value v;
  v.type_ = Type::Object;
  v.p_ = std::move(o);
  return v;
}

const std::string& Value::str() const {
  if (type_ != Type::String) return kEmpty;
  return *std::get<std::shared_ptr<const std::string>>(p_);
}

const List& Value::items() const {
  if (type_ != Type::List) return kNoItems;
  return *std::get<std::shared_ptr<const List>>(p_);
}

const Dict& Value::dict() const {
  if (type_ != Type::Dict) return kNoDict;
  return *std::get<std::shared_ptr<const Dict>>(p_);
}

Object* Value::object() const {
  if (type_ != Type::Object) return nullptr;
  return std::get<std::shared_ptr<Object>>(p_).get();
}

const std::string& Value::undefined_hint() const {
  if (type_ != Type::Undefined || !std::holds_alternative<std::shared_ptr<const std::string>>(p_)) return kEmpty;
  return *std::get<std::shared_ptr<const std::string>>(p_);
}

const void* Value::identity() const {
  return std::visit(
      [](const auto& p) -> const void* {
        if constexpr (std::is_same_v<std::decay_t<decltype(p)>, std::monostate>)
          return nullptr;
        else
          return p.get();
      },
      p_);
}

Value Object::call(Ctx&, Args) { throw EvalError("TypeError: '" + type_name() + "' object is not callable"); }

std::optional<Value> Namespace::attr(const std::string& name) const {
  if (const Value* v = attrs.find(std::string_view(name))) return *v;
  return std::nullopt;
}

void Namespace::set(const std::string& name, Value v) { attrs.set(Value(name), std::move(v)); }

std::string Namespace::repr() const { return "<Namespace " + py_repr(Value::dict(attrs)) + ">"; }

Value make_function(std::string name, Function::Fn fn, std::string kind) {
  return Value::object(std::make_shared<Function>(std::move(name), std::move(fn), std::move(kind)));
}

bool truthy(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined:
    case Value::Type::None: return false;
    case Value::Type::Bool: return v.as_bool();
    case Value::Type::Int: return v.as_int() != 0;
    case Value::Type::Float: return v.as_float() != 0.0;
    case Value::Type::String: return !v.str().empty();
    case Value::Type::List: return !v.items().empty();
    case Value::Type::Dict: return v.dict().size() != 0;
    case Value::Type::Object: return true;
  }
  return false;
}

std::string type_name(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined: return "Undefined";
    case Value::Type::None: return "NoneType";
    case Value::Type::Bool: return "bool";
    case Value::Type::Int: return "int";
    case Value::Type::Float: return "float";
    case Value::Type::String: return v.is_markup() ? "Markup" : "str";
    case Value::Type::List: return v.is_tuple() ? "tuple" : "list";
    case Value::Type::Dict: return "dict";
    case Value::Type::Object: return v.object()->type_name();
  }
  return "object";
}

std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  return type_name(v) + " object";
}

}  // namespace kvs::jinja
