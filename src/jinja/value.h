// The values templates compute with, modelled on the Python objects Jinja2
// hands around: undefined, None, bool, int, float, str (plain or Markup),
// list and tuple, dict (insertion order kept), and objects (namespaces,
// callables, loop state, generators). Lists and dicts are immutable once
// built, as in Jinja2's immutable sandbox, so values share them freely;
// only a namespace changes, through attribute assignment.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace kvs::jinja {

class Value;
class Object;
class Ctx;
using List = std::vector<Value>;

struct Dict {
  std::vector<std::pair<Value, Value>> entries;  // insertion order
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  // Replaces the value of an existing key, else appends.
  void set(Value key, Value value);
  size_t size() const { return entries.size(); }
};

// Call arguments: positional, then keyword.
struct Args {
  List pos;
  std::vector<std::pair<std::string, Value>> kw;
};

class Value {
 public:
  enum class Type : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Object };

  Value() = default;  // undefined
  // `hint` is the message an operation on it raises ("'x' is undefined");
  // `unsafe`: the sandbox refused the attribute (its use is a SecurityError).
  static Value undefined(std::string hint, bool unsafe = false);
  static Value none();
  Value(bool b) : type_(Type::Bool) { n_.b = b; }
  Value(int64_t i) : type_(Type::Int) { n_.i = i; }
  Value(int i) : Value(int64_t(i)) {}
  Value(double d) : type_(Type::Float) { n_.f = d; }
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  static Value markup(std::string s);  // a Markup (safe) string
  static Value list(List items);
  static Value tuple(List items);
  static Value dict(Dict d);
  static Value object(std::shared_ptr<Object> o);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::Undefined; }
  bool is_none() const { return type_ == Type::None; }
  bool is_bool() const { return type_ == Type::Bool; }
  bool is_int() const { return type_ == Type::Int; }
  bool is_float() const { return type_ == Type::Float; }
  bool is_integral() const { return type_ == Type::Int || type_ == Type::Bool; }  // Python int (bool included)
  bool is_number() const { return is_integral() || is_float(); }
  bool is_string() const { return type_ == Type::String; }
  bool is_markup() const { return type_ == Type::String && flag_; }
  bool is_list() const { return type_ == Type::List; }  // list or tuple
  bool is_tuple() const { return type_ == Type::List && flag_; }
  bool is_dict() const { return type_ == Type::Dict; }
  bool is_object() const { return type_ == Type::Object; }

  bool as_bool() const { return n_.b; }
  int64_t as_int() const { return type_ == Type::Bool ? int64_t(n_.b) : n_.i; }  // Int or Bool
  double as_float() const { return type_ == Type::Float ? n_.f : double(as_int()); }
  const std::string& str() const;
  const List& items() const;
  const Dict& dict() const;
  Object* object() const;
  template <class T>
  T* object_as() const {
    return type_ == Type::Object ? dynamic_cast<T*>(object()) : nullptr;
  }
  const std::string& undefined_hint() const;
  bool undefined_unsafe() const { return flag_; }
  // Identity of the shared payload (for `is sameas`); null for scalars.
  const void* identity() const;

 private:
  Type type_ = Type::Undefined;
  bool flag_ = false;  // string: Markup; list: tuple; undefined: unsafe
  union {
    bool b;
    int64_t i;
    double f;
  } n_{};
  std::variant<std::monostate, std::shared_ptr<const std::string>, std::shared_ptr<const List>,
               std::shared_ptr<const Dict>, std::shared_ptr<Object>>
      p_;
};

// Objects: namespaces, callables, loop state, generators.
class Object {
 public:
  virtual ~Object() = default;
  virtual std::string type_name() const = 0;  // as Python names the type ("Namespace", "function")
  virtual std::optional<Value> attr(const std::string& name) const { return std::nullopt; }
  virtual bool callable() const { return false; }
  virtual Value call(Ctx& ctx, Args args);
  virtual std::string repr() const { return "<" + type_name() + " object>"; }
  // Lets go of the values it holds; the render calls it on the objects it
  // made when it ends, so that reference cycles (a namespace holding
  // itself, a macro and its scope) are freed.
  virtual void drop_refs() {}
};

// A lazy, consume-once sequence, as the generators Jinja2's select, map,
// unique, items and reverse filters return: iterating it again yields
// nothing, it is always true, and it has no length.
class Generator : public Object {
 public:
  using Next = std::function<std::optional<Value>()>;
  explicit Generator(Next next, std::string kind = "generator") : next_(std::move(next)), kind_(std::move(kind)) {}
  std::string type_name() const override { return kind_; }
  std::optional<Value> pull() { return next_ ? next_() : std::nullopt; }

 private:
  Next next_;
  std::string kind_;
};

// A Jinja2 namespace(): the one mutable value (attribute assignment).
class Namespace : public Object {
 public:
  std::string type_name() const override { return "Namespace"; }
  std::optional<Value> attr(const std::string& name) const override;
  void set(const std::string& name, Value v);
  std::string repr() const override;
  void drop_refs() override { attrs.entries.clear(); }
  Dict attrs;
};

// A function implemented in C++ (globals, bound methods).
class Function : public Object {
 public:
  using Fn = std::function<Value(Ctx&, Args&)>;
  Function(std::string name, Fn fn, std::string kind = "function")
      : name_(std::move(name)), fn_(std::move(fn)), kind_(std::move(kind)) {}
  std::string type_name() const override { return kind_; }
  bool callable() const override { return true; }
  Value call(Ctx& ctx, Args args) override { return fn_(ctx, args); }
  std::string repr() const override { return "<" + kind_ + " " + name_ + ">"; }

 private:
  std::string name_;
  Fn fn_;
  std::string kind_;
};

Value make_function(std::string name, Function::Fn fn, std::string kind = "function");

// Python truthiness.
bool truthy(const Value& v);
// Python's type name for messages ("str", "int", "NoneType", "dict").
std::string type_name(const Value& v);
// Jinja2's object_type_repr: "dict object", "None", ...
std::string object_type_repr(const Value& v);

}  // namespace kvs::jinja
