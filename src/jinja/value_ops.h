// Python's operators on template values, as Jinja2 evaluates them:
// equality and ordering, arithmetic (Markup escaping its plain operand),
// membership, attribute and item lookup with Jinja2's fallbacks (an
// attribute that is not there is undefined; the sandbox's refusals are
// undefined values whose use raises), slicing, iteration and len().
#pragma once
#include <optional>
#include <string>

#include "jinja/ctx.h"
#include "jinja/value.h"

namespace kvs::jinja {

enum class BinOp { Add, Sub, Mul, Div, FloorDiv, Mod, Pow };
enum class CmpOp { Eq, Ne, Lt, Le, Gt, Ge, In, NotIn };

// Throws the error an operation on an undefined value raises.
[[noreturn]] void fail_undefined(const Value& u);
[[noreturn]] void type_error(const std::string& message);

bool py_equal(const Value& a, const Value& b);
// a < b, Python's ordering; throws TypeError for values that do not order.
bool py_less(const Value& a, const Value& b);
bool compare(Ctx& ctx, CmpOp op, const Value& a, const Value& b);
bool contains(Ctx& ctx, const Value& container, const Value& item);

Value binary(Ctx& ctx, BinOp op, const Value& a, const Value& b);
Value negate(const Value& a);
Value unary_plus(const Value& a);
// String concatenation `~` (str() of both, never Markup: autoescape is off).
std::string concat_str(const Value& v);

// obj.name and obj[key] as Jinja2's sandboxed getattr / getitem.
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step]; missing bounds are none.
Value get_slice(Ctx& ctx, const Value& obj, const Value& start, const Value& stop, const Value& step);

// Iteration as Python's iter(): lists, dict keys, characters of a string,
// nothing for undefined, a generator's remaining items; TypeError otherwise.
using Iter = Generator::Next;
Iter iterate(const Value& v);
List to_list(Ctx& ctx, const Value& v);
// len(v); TypeError for values without a length.
size_t py_len(const Value& v);
// Python slice indices for a sequence of `len` (PySlice_AdjustIndices).
struct SliceIdx {
  int64_t start, stop, step, count;
};
SliceIdx slice_indices(const Value& start, const Value& stop, const Value& step, int64_t len);

}  // namespace kvs::jinja
