#include "tools/default_model.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "tools/make_model.h"

namespace fs = std::filesystem;

namespace kvs {

static const char* kSharedRel = "models/stories260K/stories260K.gguf";

static std::vector<fs::path> shared_candidates() {
  std::vector<fs::path> c;
  if (const char* s = std::getenv("KVSERVE_SHARED")) c.emplace_back(fs::path(s) / kSharedRel);
  c.emplace_back(fs::path("..") / "shared" / kSharedRel);
  c.emplace_back(fs::path("shared") / kSharedRel);
  // The binary usually sits in <repo>/build/: try <repo>/../shared.
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) c.emplace_back(exe.parent_path().parent_path().parent_path() / "shared" / kSharedRel);
  return c;
}

std::string resolve_model_path(const std::string& explicit_path) {
  if (!explicit_path.empty()) return explicit_path;
  for (const auto& p : shared_candidates()) {
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return fs::weakly_canonical(p, ec).string();
  }
  fs::path dir;
  if (const char* x = std::getenv("XDG_CACHE_HOME")) dir = fs::path(x) / "kvserve";
  else if (const char* h = std::getenv("HOME")) dir = fs::path(h) / ".cache" / "kvserve";
  else dir = fs::temp_directory_path() / "kvserve";
  fs::create_directories(dir);
  const fs::path out = dir / "random-tiny-llama.gguf";
  std::fprintf(stderr,
               "kvserve: no --model given and ../shared/%s not found;\n"
               "kvserve: using a small RANDOM-WEIGHT model (its text is noise): %s\n",
               kSharedRel, out.c_str());
  if (!fs::exists(out)) {
    MakeModelOptions o;
    o.out = out.string();
    apply_model_preset("tiny", o);
    o.type = GgmlType::F32;
    o.progress = false;
    make_random_model(o);
    std::fprintf(stderr, "kvserve: wrote %s with kvserve's GGUF writer\n", out.c_str());
  }
  return out.string();
}

}  // namespace kvs
