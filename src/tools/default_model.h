// Which model file to run when the user names none.
#pragma once
#include <string>

namespace kvs {

// `explicit_path` (from --model) always wins. Otherwise the shared default
// (stories260K.gguf under $KVSERVE_SHARED, ./../shared, ./shared or next to
// the binary's repository) when present; otherwise a small random-weight model
// written once with kvserve's own GGUF writer into $XDG_CACHE_HOME/kvserve (or
// ~/.cache/kvserve), announced on stderr.
std::string resolve_model_path(const std::string& explicit_path);

}  // namespace kvs
