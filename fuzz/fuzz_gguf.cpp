// libFuzzer target for the GGUF reader: any input must either parse (and
// then every pointer handed out must be readable) or throw ModelError.
// Anything else (a crash, a sanitizer report, another exception type) is a bug.
//
// For coverage-guided fuzzing the libraries need instrumenting too:
//   CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DKVS_BUILD_FUZZ=ON \
//     -DKVS_BUILD_TESTS=OFF -DKVS_BUILD_BENCH=OFF -DKVS_SANITIZE=ON \
//     -DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link
//   ninja -C build-fuzz fuzz_gguf
//   mkdir -p fuzz-corpus-work && ./build-fuzz/fuzz_gguf fuzz-corpus-work fuzz/corpus/gguf -max_total_time=120
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/gguf.h"
#include "model/vocab_loaders.h"
#include "model/model.h"
#include "tokenizer/vocab.h"

namespace {

size_t touch(const kvs::GgufValue& v) {
  size_t h = static_cast<size_t>(v.type);
  if (v.is_array()) {
    const kvs::GgufArray& a = v.as_arr();
    h += a.size();
    for (const auto& s : a.strings) h += s.empty() ? 0 : static_cast<unsigned char>(s.back());
    for (float f : a.f32) h += f > 0;
    for (int64_t i : a.ints) h += static_cast<size_t>(i);
    for (const auto& it : a.items) h += touch(it);
  } else if (v.is_string()) {
    h += v.as_str().size();
  }
  return h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = kvs::GgufFile::parse(data, size, "fuzz");
    volatile size_t h = 0;
    for (const auto& [k, v] : f->metadata()) h = h + k.size() + touch(v);
    std::vector<float> row;
    for (const auto& t : f->tensors()) {
      if (t.nbytes) h = h + t.data[0] + t.data[t.nbytes - 1];
      // Dequantize the first row of small supported tensors (those with at
      // least one row): reads row_bytes(type, dims[0]) <= nbytes bytes.
      const kvs::TypeTraits& tt = kvs::type_traits(t.type);
      if (tt.supported && t.dims[0] > 0 && t.dims[0] <= 4096 && t.nbytes >= kvs::row_bytes(t.type, t.dims[0])) {
        row.resize(static_cast<size_t>(t.dims[0]));
        kvs::dequantize_row(t.type, t.data, row.data(), t.dims[0]);
        h = h + (row[0] > 0);
      }
    }
    // Metadata consumers must also fail only with ModelError.
    try {
      kvs::ModelConfig c = kvs::config_from_gguf(*f);
      h = h + c.dim;
    } catch (const kvs::ModelError&) {
    }
    try {
      kvs::Vocab v = kvs::vocab_from_gguf(*f);
      h = h + v.size();
    } catch (const kvs::ModelError&) {
    }
  } catch (const kvs::ModelError&) {
  }
  return 0;
}
