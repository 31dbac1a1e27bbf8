// The filters on sequences and mappings (filters_seq.cpp); find_filter
// looks here after the text filters. Internal to src/jinja.
#pragma once
#include <string>

#include "jinja/filters.h"

namespace kvs::jinja {

FilterFn find_seq_filter(const std::string& name);

}  // namespace kvs::jinja
