// Every top-level field a completions or chat request may carry, and what
// kvserve does with it. A field that would change the output is never
// ignored: it is implemented, or refused with a 400 naming it. Fields that
// only carry the client's own bookkeeping are accepted and logged nowhere.
// docs/SERVER.md ("Request fields") is the same table for people.
#pragma once
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "server/openai_codec.h"

namespace kvs::server {

enum class FieldUse : uint8_t {
  Used,         // implemented
  Metadata,     // accepted; the client's bookkeeping (user, metadata, store, service_tier)
  Unsupported,  // known but not implemented: 400 with the field as `param`
};

struct FieldSpec {
  const char* name;
  bool completions, chat;  // where the field belongs
  FieldUse use;
  const char* why;         // Unsupported: the 400's reason
};

const std::vector<FieldSpec>& request_fields();

// Throws ApiError (400, param = the field) for a field the endpoint does
// not know, a known field kvserve does not implement, or a value of one
// that is accepted only in its trivial form (best_of 1, modalities ["text"],
// response_format text, tool_choice "none" without tools).
void check_fields(Endpoint ep, const nlohmann::json& body);

}  // namespace kvs::server
