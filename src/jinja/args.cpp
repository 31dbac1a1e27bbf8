#include "jinja/args.h"

#include "jinja/value_ops.h"

namespace kvs::jinja {

ArgReader::ArgReader(std::string fn, const Args& args, std::initializer_list<const char*> params)
    : fn_(std::move(fn)), bound_(params.size(), nullptr) {
  if (args.pos.size() > params.size())
    type_error(fn_ + "() takes at most " + std::to_string(params.size()) + " arguments (" +
               std::to_string(args.pos.size()) + " given)");
  for (size_t i = 0; i < args.pos.size(); ++i) bound_[i] = &args.pos[i];
  for (const auto& [k, v] : args.kw) {
    size_t i = 0;
    for (const char* p : params) {
      if (k == p) break;
      ++i;
    }
    if (i == params.size()) type_error(fn_ + "() got an unexpected keyword argument '" + k + "'");
    if (bound_[i]) type_error(fn_ + "() got multiple values for argument '" + k + "'");
    bound_[i] = &v;
  }
}

void no_args(const char* fn, const Args& args) { ArgReader(fn, args, {}); }

int64_t ArgReader::int_or(size_t i, int64_t dflt) const {
  if (!bound_[i] || bound_[i]->is_none()) return dflt;
  if (!bound_[i]->is_integral())
    type_error(fn_ + "(): '" + type_name(*bound_[i]) + "' object cannot be interpreted as an integer");
  return bound_[i]->as_int();
}

std::string ArgReader::str_or(size_t i, const std::string& dflt) const {
  if (!bound_[i] || bound_[i]->is_none()) return dflt;
  if (!bound_[i]->is_string()) type_error(fn_ + "() argument must be str, not " + type_name(*bound_[i]));
  return bound_[i]->str();
}

bool ArgReader::bool_or(size_t i, bool dflt) const { return bound_[i] ? truthy(*bound_[i]) : dflt; }

}  // namespace kvs::jinja
