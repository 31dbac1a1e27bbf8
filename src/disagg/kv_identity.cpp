#include "disagg/kv_identity.h"

namespace kvs::disagg {

KvIdentity make_identity(const std::string& model_identity, const KvLayout& layout) {
  KvIdentity id;
  id.model = model_identity;
  id.kv_type = to_string(layout.type);
  id.layout = layout.describe();
  id.block_size = layout.block_size;
  id.n_layers = layout.n_layers;
  id.n_kv_heads = layout.n_kv_heads;
  id.head_dim = layout.head_dim;
  id.block_bytes = layout.block_bytes();
  id.residual_floats = layout.residual_floats();
  return id;
}

namespace {
template <class T>
void note(std::string& out, const char* what, const T& here, const T& there) {
  if (here == there) return;
  if (!out.empty()) out += "; ";
  if constexpr (std::is_same_v<T, std::string>)
    out += std::string(what) + ": " + here + " here, " + there + " there";
  else
    out += std::string(what) + ": " + std::to_string(here) + " here, " + std::to_string(there) + " there";
}
}  // namespace

std::string mismatch(const KvIdentity& mine, const KvIdentity& theirs) {
  std::string out;
  note(out, "protocol version", mine.version, theirs.version);
  // Model identities are long hashes: name the difference, not the values.
  if (mine.model != theirs.model) out += std::string(out.empty() ? "" : "; ") + "model: different weights";
  note(out, "kv type", mine.kv_type, theirs.kv_type);
  note(out, "kv layout", mine.layout, theirs.layout);
  note(out, "block size", mine.block_size, theirs.block_size);
  note(out, "layers", mine.n_layers, theirs.n_layers);
  note(out, "kv heads", mine.n_kv_heads, theirs.n_kv_heads);
  note(out, "head dim", mine.head_dim, theirs.head_dim);
  note(out, "block bytes", mine.block_bytes, theirs.block_bytes);
  note(out, "residual floats", mine.residual_floats, theirs.residual_floats);
  return out;
}

}  // namespace kvs::disagg
