// GGUF reader and writer: the shared model files, a writer round trip with
// every value type, and a suite of broken files (truncated, lying counts,
// bad offsets, unknown types) that must fail with a ModelError naming the
// file and the key or tensor, never crash. Also replays the fuzz corpus.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "gguf_test_util.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/model.h"
#include "test_util.h"

using namespace kvs;
using namespace kvs::test;
namespace fs = std::filesystem;

namespace {

// Reads every value and the first/last byte of every tensor, so that any
// pointer the parser handed out is exercised.
size_t touch_value(const GgufValue& v) {
  size_t h = static_cast<size_t>(v.type);
  if (v.is_array()) {
    const GgufArray& a = v.as_arr();
    h += a.size();
    for (const auto& s : a.strings) h += s.size();
    for (float f : a.f32) h += std::isnan(f) ? 1 : 0;
    for (int64_t i : a.ints) h += static_cast<size_t>(i);
    for (const auto& it : a.items) h += touch_value(it);
  } else if (v.is_string()) {
    h += v.as_str().size();
  }
  return h;
}

size_t touch_all(const GgufFile& f) {
  size_t h = f.version() + f.alignment();
  for (const auto& [k, v] : f.metadata()) h += k.size() + touch_value(v);
  for (const auto& t : f.tensors()) {
    h += t.n_elements() + t.name.size();
    if (t.nbytes) h += t.data[0] + t.data[t.nbytes - 1];
  }
  return h;
}

std::map<std::string, int> type_counts(const GgufFile& f) {
  std::map<std::string, int> m;
  for (const auto& t : f.tensors()) m[type_name(t.type)]++;
  return m;
}

std::string tmp(const std::string& name) { return temp_dir() + "/" + name; }

}  // namespace

// ---- the shared files ----------------------------------------------------------

TEST(GgufShared, EveryFileParses) {
  if (!shared_available()) GTEST_SKIP() << "../shared not available";
  int n = 0;
  for (const std::string dir : {"models/stories260K", "models/tiny-random", "golden/tokenizer"}) {
    for (const auto& e : fs::directory_iterator(shared(dir))) {
      if (e.path().extension() != ".gguf") continue;
      SCOPED_TRACE(e.path().string());
      auto f = GgufFile::open(e.path().string());
      EXPECT_EQ(f->version(), 3u);
      EXPECT_EQ(f->alignment(), 32u);
      EXPECT_GT(touch_all(*f), 0u);
      for (const auto& t : f->tensors()) EXPECT_EQ(t.offset % 32, 0u) << t.name;
      ++n;
    }
  }
  EXPECT_EQ(n, 7);
}

TEST(GgufShared, Stories260KMetadata) {
  if (!shared_available()) GTEST_SKIP();
  auto f = GgufFile::open(shared("models/stories260K/stories260K.gguf"));
  EXPECT_EQ(f->get_str("general.architecture"), "llama");
  EXPECT_EQ(f->get_u64("llama.embedding_length"), 64u);
  EXPECT_EQ(f->get_u64("llama.block_count"), 5u);
  EXPECT_EQ(f->get_u64("llama.attention.head_count"), 8u);
  EXPECT_EQ(f->get_u64("llama.attention.head_count_kv"), 4u);
  EXPECT_EQ(f->get_u64("llama.context_length"), 512u);
  EXPECT_NEAR(f->get_f64("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-12);
  EXPECT_EQ(f->get_u64("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(f->find("tokenizer.ggml.tokens")->as_arr().strings.size(), 512u);
  EXPECT_EQ(f->find("tokenizer.ggml.scores")->as_arr().f32.size(), 512u);
  EXPECT_EQ(f->find("tokenizer.ggml.token_type")->as_arr().ints.size(), 512u);
  EXPECT_EQ(f->find("tokenizer.ggml.tokens")->as_arr().strings[1], "<s>");
  EXPECT_EQ(f->tensors().size(), 48u);
  EXPECT_EQ(type_counts(*f), (std::map<std::string, int>{{"F32", 48}}));
  const auto& q = f->tensor("blk.0.attn_q.weight", {64, 64});
  EXPECT_EQ(q.nbytes, 64u * 64 * 4);
  EXPECT_EQ(f->tensor("blk.4.attn_k.weight", {64, 32}).n_elements(), 2048);
  EXPECT_FALSE(f->opt_u64("llama.rope.freq_base").has_value());
  EXPECT_EQ(f->opt_str("general.nothing"), std::nullopt);
  // Typed getters name the file and key.
  std::string e = model_error([&] { f->get_u64("general.architecture"); });
  EXPECT_NE(e.find("stories260K.gguf"), std::string::npos) << e;
  EXPECT_NE(e.find("'general.architecture'"), std::string::npos) << e;
  e = model_error([&] { f->get_str("llama.missing_key"); });
  EXPECT_NE(e.find("'llama.missing_key'"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
  e = model_error([&] { f->tensor("blk.0.attn_q.weight", {64, 32}); });
  EXPECT_NE(e.find("'blk.0.attn_q.weight' has shape [64, 64], expected [64, 32]"), std::string::npos) << e;
  e = model_error([&] { f->tensor("blk.9.attn_q.weight", {64, 64}); });
  EXPECT_NE(e.find("'blk.9.attn_q.weight' is missing"), std::string::npos) << e;
}

TEST(GgufShared, TinyRandomTensorTypes) {
  if (!shared_available()) GTEST_SKIP();
  auto k = GgufFile::open(shared("models/tiny-random/tiny-qwen2-q4_k_m.gguf"));
  auto tk = type_counts(*k);
  for (const char* t : {"Q4_K", "Q5_0", "Q6_K", "Q8_0", "F32"}) EXPECT_GT(tk[t], 0) << t;
  EXPECT_EQ(k->tensors().size(), 50u);
  EXPECT_EQ(k->get_str("general.architecture"), "qwen2");
  EXPECT_EQ(k->find("tokenizer.ggml.merges")->as_arr().strings.size(), 50000u);
  EXPECT_EQ(k->find("tokenizer.ggml.tokens")->as_arr().size(), 50257u);
  EXPECT_NEAR(k->get_f64("qwen2.rope.freq_base"), 1e6, 1e-3);
  EXPECT_EQ(k->find_tensor("output.weight"), nullptr);  // tied
  EXPECT_EQ(k->tensor("blk.0.attn_k.bias", {32}).type, GgmlType::F32);

  auto q4 = GgufFile::open(shared("models/tiny-random/tiny-llama-q4_0.gguf"));
  EXPECT_EQ(type_counts(*q4), (std::map<std::string, int>{{"F32", 9}, {"Q4_0", 28}, {"Q6_K", 1}}));
  EXPECT_EQ(q4->tensor("token_embd.weight", {256, 32000}).type, GgmlType::Q6_K);
  auto f16 = GgufFile::open(shared("models/tiny-random/tiny-llama-f16.gguf"));
  EXPECT_EQ(type_counts(*f16), (std::map<std::string, int>{{"F16", 29}, {"F32", 9}}));
  auto q8 = GgufFile::open(shared("models/tiny-random/tiny-qwen2-q8_0.gguf"));
  EXPECT_EQ(type_counts(*q8), (std::map<std::string, int>{{"F32", 21}, {"Q8_0", 29}}));

  auto v = GgufFile::open(shared("golden/tokenizer/ggml-vocab-llama-spm.gguf"));
  EXPECT_TRUE(v->tensors().empty());
  EXPECT_TRUE(v->get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(v->find("tokenizer.ggml.tokens")->as_arr().size(), 32000u);
}

TEST(GgufShared, LargeVocabParsesFast) {
  if (!shared_available()) GTEST_SKIP();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) GgufFile::open(shared("golden/tokenizer/ggml-vocab-gpt-2.gguf"));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 5;
  EXPECT_LT(ms, 300.0) << "100k strings took " << ms << " ms";
}

// ---- writer round trip ------------------------------------------------------------

namespace {

template <class T>
GgufValue val(GgufType t, T v) {
  GgufValue g;
  g.type = t;
  g.v = v;
  return g;
}

GgufValue arr_items(GgufType et, std::vector<GgufValue> items) {
  auto a = std::make_shared<GgufArray>();
  a->elem_type = et;
  a->items = std::move(items);
  return val(GgufType::ARRAY, a);
}

GgufValue arr_ints(GgufType et, std::vector<int64_t> ints) {
  auto a = std::make_shared<GgufArray>();
  a->elem_type = et;
  a->ints = std::move(ints);
  return val(GgufType::ARRAY, a);
}

}  // namespace

// Reader, writer and vocab checks share one integer-type rule.
TEST(GgufTypes, IntegerTypes) {
  for (GgufType t : {GgufType::UINT8, GgufType::INT8, GgufType::UINT16, GgufType::INT16, GgufType::UINT32,
                     GgufType::INT32, GgufType::UINT64, GgufType::INT64})
    EXPECT_TRUE(gguf_is_integer(t)) << int(t);
  for (GgufType t : {GgufType::FLOAT32, GgufType::FLOAT64, GgufType::BOOL, GgufType::STRING, GgufType::ARRAY})
    EXPECT_FALSE(gguf_is_integer(t)) << int(t);
}

TEST(GgufWriter, RoundTripEveryValueTypeAndTensorType) {
  GgufWriter w;
  w.set_value("t.u8", val(GgufType::UINT8, uint64_t(250)));
  w.set_value("t.i8", val(GgufType::INT8, int64_t(-100)));
  w.set_value("t.u16", val(GgufType::UINT16, uint64_t(65000)));
  w.set_value("t.i16", val(GgufType::INT16, int64_t(-30000)));
  w.set_u32("t.u32", 4000000000u);
  w.set_i32("t.i32", -2000000000);
  w.set_f32("t.f32", 0.125f);
  w.set_bool("t.bool", true);
  w.set_str("t.str", std::string("h\xC3\xA9llo\0x", 8));  // UTF-8 and an embedded NUL
  w.set_u64("t.u64", 1ull << 60);
  w.set_value("t.i64", val(GgufType::INT64, int64_t(-(1ll << 60))));
  w.set_value("t.f64", val(GgufType::FLOAT64, 1e300));
  w.set_str_array("t.arr.str", {"a", "", "ccc"});
  w.set_f32_array("t.arr.f32", {1.5f, -2.f});
  w.set_i32_array("t.arr.i32", {-1, 7});
  w.set_value("t.arr.u8", arr_ints(GgufType::UINT8, {0, 255}));
  w.set_value("t.arr.i64", arr_ints(GgufType::INT64, {-5, 1ll << 40}));
  w.set_value("t.arr.bool", arr_items(GgufType::BOOL, {val(GgufType::BOOL, true), val(GgufType::BOOL, false)}));
  w.set_value("t.arr.f64", arr_items(GgufType::FLOAT64, {val(GgufType::FLOAT64, 2.5)}));
  w.set_value("t.arr.empty", arr_ints(GgufType::UINT32, {}));
  w.set_value("t.arr.nested", arr_items(GgufType::ARRAY, {arr_ints(GgufType::INT16, {1, -2}), arr_ints(GgufType::INT16, {3})}));
  w.set_u32("t.overwritten", 1);
  w.set_u32("t.overwritten", 2);
  w.set_u32("general.alignment", 64);

  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 0.5f);
  const GgmlType types[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1,
                            GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                            GgmlType::MXFP4};
  std::map<std::string, std::vector<uint8_t>> expect;
  for (GgmlType t : types) {
    const std::vector<int64_t> dims = {256, 3};
    std::vector<float> x(256 * 3);
    for (auto& v : x) v = nd(rng);
    const std::string name = "w." + type_name(t);
    w.add_tensor_f32(name, t, dims, x.data());
    std::vector<uint8_t> q(row_bytes(t, 256) * 3);
    for (int r = 0; r < 3; ++r) quantize_row(t, x.data() + r * 256, q.data() + r * row_bytes(t, 256), 256);
    expect[name] = q;
  }
  std::vector<uint8_t> raw(4 * 5);
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint8_t>(i);
  w.add_tensor("raw.1d", GgmlType::F32, {5}, raw);
  w.add_tensor("raw.4d", GgmlType::F16, {2, 1, 2, 1}, std::vector<uint8_t>(8, 0x3C));
  w.add_tensor_rows("rows.3d", GgmlType::F32, {4, 2, 2}, [](int64_t r, float* out) {
    for (int i = 0; i < 4; ++i) out[i] = static_cast<float>(r * 4 + i);
  });

  EXPECT_THROW(w.add_tensor("raw.1d", GgmlType::F32, {5}, raw), ModelError);              // duplicate
  EXPECT_THROW(w.add_tensor("bad.size", GgmlType::F32, {6}, raw), ModelError);            // 20 bytes for 24
  EXPECT_THROW(w.add_tensor("bad.block", GgmlType::Q8_0, {16}, std::vector<uint8_t>(17)), ModelError);
  EXPECT_THROW(w.add_tensor("bad.dims", GgmlType::F32, {1, 1, 1, 1, 1}, std::vector<uint8_t>(4)), ModelError);

  const std::string path = tmp("roundtrip.gguf");
  w.write(path);
  EXPECT_FALSE(fs::exists(path + ".tmp." + std::to_string(getpid())));
  auto f = GgufFile::open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->find("t.u8")->type, GgufType::UINT8);
  EXPECT_EQ(f->get_u64("t.u8"), 250u);
  EXPECT_EQ(f->find("t.i8")->as_i64(), -100);
  EXPECT_EQ(f->get_u64("t.u16"), 65000u);
  EXPECT_EQ(f->find("t.i16")->as_i64(), -30000);
  EXPECT_EQ(f->get_u64("t.u32"), 4000000000u);
  EXPECT_EQ(f->find("t.i32")->as_i64(), -2000000000);
  EXPECT_EQ(f->find("t.f32")->type, GgufType::FLOAT32);
  EXPECT_EQ(f->get_f64("t.f32"), 0.125);
  EXPECT_TRUE(f->get_bool("t.bool"));
  EXPECT_EQ(f->get_str("t.str"), std::string("h\xC3\xA9llo\0x", 8));
  EXPECT_EQ(f->get_u64("t.u64"), 1ull << 60);
  EXPECT_EQ(f->find("t.i64")->as_i64(), -(1ll << 60));
  EXPECT_EQ(f->get_f64("t.f64"), 1e300);
  EXPECT_EQ(f->find("t.arr.str")->as_arr().strings, (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(f->find("t.arr.f32")->as_arr().f32, (std::vector<float>{1.5f, -2.f}));
  EXPECT_EQ(f->find("t.arr.i32")->as_arr().ints, (std::vector<int64_t>{-1, 7}));
  EXPECT_EQ(f->find("t.arr.i32")->as_arr().elem_type, GgufType::INT32);
  EXPECT_EQ(f->find("t.arr.u8")->as_arr().ints, (std::vector<int64_t>{0, 255}));
  EXPECT_EQ(f->find("t.arr.i64")->as_arr().ints, (std::vector<int64_t>{-5, 1ll << 40}));
  const auto& b = f->find("t.arr.bool")->as_arr();
  ASSERT_EQ(b.size(), 2u);
  EXPECT_TRUE(b.items[0].as_bool());
  EXPECT_FALSE(b.items[1].as_bool());
  EXPECT_EQ(f->find("t.arr.f64")->as_arr().items.at(0).as_f64(), 2.5);
  EXPECT_EQ(f->find("t.arr.empty")->as_arr().size(), 0u);
  const auto& nested = f->find("t.arr.nested")->as_arr();
  ASSERT_EQ(nested.size(), 2u);
  EXPECT_EQ(nested.items[0].as_arr().ints, (std::vector<int64_t>{1, -2}));
  EXPECT_EQ(nested.items[1].as_arr().elem_type, GgufType::INT16);
  EXPECT_EQ(f->get_u64("t.overwritten"), 2u);

  EXPECT_EQ(f->tensors().size(), expect.size() + 3);
  for (const auto& [name, bytes] : expect) {
    const auto& t = f->tensor(name, {256, 3});
    EXPECT_EQ(t.offset % 64, 0u) << name;
    EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.nbytes), bytes) << name;
  }
  const auto& r1 = f->tensor("raw.1d", {5});
  EXPECT_EQ(std::vector<uint8_t>(r1.data, r1.data + r1.nbytes), raw);
  EXPECT_EQ(f->tensor("raw.4d", {2, 1, 2, 1}).type, GgmlType::F16);
  const auto& r3 = f->tensor("rows.3d", {4, 2, 2});
  std::vector<float> got(16);
  std::memcpy(got.data(), r3.data, 64);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(got[i], float(i));

  // Re-writing what was read (set_value of every key, same tensors) gives the same file.
  const std::string path2 = tmp("roundtrip2.gguf");
  rewrite_gguf(path, path2, nullptr, nullptr);
  auto f2 = GgufFile::open(path2);
  EXPECT_EQ(f2->metadata().size(), f->metadata().size());
  EXPECT_EQ(touch_all(*f2), touch_all(*f));
}

TEST(GgufWriter, RejectsBadValuesAndPaths) {
  GgufWriter w;
  w.set_value("bad.u8", val(GgufType::UINT8, uint64_t(300)));
  std::string e = model_error([&] { w.write(tmp("bad_value.gguf")); });
  EXPECT_NE(e.find("bad.u8"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(tmp("bad_value.gguf")));
  GgufWriter w2;
  w2.set_u32("general.alignment", 48);
  EXPECT_NE(model_error([&] { w2.write(tmp("bad_align.gguf")); }).find("alignment"), std::string::npos);
  GgufWriter w3;
  EXPECT_NE(model_error([&] { w3.write("/nonexistent-dir/x.gguf"); }).find("/nonexistent-dir/x.gguf"), std::string::npos);
}

// ---- broken files ----------------------------------------------------------------

namespace {

// A small valid file: 2 keys, two F32 tensors.
RawGguf valid_raw() {
  RawGguf r;
  r.header(2, 2).kv_str("general.architecture", "llama").kv_u32("x.count", 7);
  r.tensor("a.weight", {4, 2}, 0, 0).tensor("b.weight", {8}, 0, 32);
  r.pad();
  r.zeros(32 + 32);
  return r;
}

// Writes `bytes`, opens it, returns the error ("" if it opened).
std::string open_error(const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::string p = tmp(name);
  write_bytes(p, bytes);
  return model_error([&] { GgufFile::open(p); });
}

void expect_error(const std::string& name, const RawGguf& r, std::initializer_list<const char*> parts) {
  const std::string e = open_error(name, r.b);
  ASSERT_FALSE(e.empty()) << name << " opened without error";
  EXPECT_NE(e.find(tmp(name)), std::string::npos) << "message does not name the file: " << e;
  for (const char* p : parts) EXPECT_NE(e.find(p), std::string::npos) << "missing '" << p << "' in: " << e;
  // The in-memory parser agrees.
  EXPECT_THROW(GgufFile::parse(r.b.data(), r.b.size(), name), ModelError);
}

}  // namespace

TEST(GgufBad, ValidBaseOpens) {
  const RawGguf r = valid_raw();
  EXPECT_EQ(open_error("valid.gguf", r.b), "");
  auto f = GgufFile::parse(r.b.data(), r.b.size(), "mem");
  EXPECT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors()[1].data, r.b.data() + (r.b.size() - 64) + 32);
}

TEST(GgufBad, TruncatedAtEveryCut) {
  const RawGguf r = valid_raw();
  // The last tensor ends exactly at the file end, so every proper prefix is invalid.
  for (size_t cut = 0; cut < r.b.size(); ++cut) {
    std::vector<uint8_t> b(r.b.begin(), r.b.begin() + cut);
    SCOPED_TRACE(cut);
    if (cut == 0) {
      EXPECT_NE(open_error("cut.gguf", b).find("empty"), std::string::npos);
      continue;
    }
    EXPECT_NE(open_error("cut.gguf", b).find(tmp("cut.gguf")), std::string::npos);
    EXPECT_THROW(GgufFile::parse(b.data(), b.size(), "cut"), ModelError);
  }
  // And a real model cut at many points.
  if (!shared_available()) return;
  const auto full = read_bytes(shared("models/tiny-random/tiny-qwen2-q4_k_m.gguf"));
  std::mt19937 rng(3);
  std::vector<size_t> cuts = {4, 8, 16, 24, 100, 1000, full.size() / 2, full.size() - 1};
  for (int i = 0; i < 40; ++i) cuts.push_back(rng() % full.size());
  for (size_t cut : cuts) {
    std::string e;
    try {
      GgufFile::parse(full.data(), cut, "tiny-qwen2-cut");
    } catch (const ModelError& ex) {
      e = ex.what();
    }
    EXPECT_NE(e.find("tiny-qwen2-cut"), std::string::npos) << "cut " << cut << ": " << e;
  }
}

TEST(GgufBad, HeaderProblems) {
  RawGguf magic = valid_raw();
  magic.b[0] = 'X';
  expect_error("magic.gguf", magic, {"not a GGUF file", "XGUF"});
  RawGguf v1 = valid_raw();
  v1.b[4] = 1;
  expect_error("v1.gguf", v1, {"version 1"});
  RawGguf v9 = valid_raw();
  v9.b[4] = 9;
  expect_error("v9.gguf", v9, {"unsupported GGUF version 9"});
  RawGguf be = valid_raw();
  be.b[4] = 0;
  be.b[7] = 3;
  expect_error("bigendian.gguf", be, {"big-endian"});
  expect_error("tiny.gguf", RawGguf().pod<uint16_t>(0x4747), {"magic"});
}

TEST(GgufBad, AbsurdCounts) {
  RawGguf t;
  t.header(1ull << 60, 0);
  expect_error("ntensors.gguf", t, {"tensor count 1152921504606846976"});
  RawGguf k;
  k.header(0, 1ull << 60);
  expect_error("nkv.gguf", k, {"metadata count"});
  RawGguf s;
  s.header(0, 1).str("general.name").u32(8).u64(1ull << 60);
  expect_error("strlen.gguf", s, {"'general.name'", "length 1152921504606846976"});
  RawGguf kl;
  kl.header(0, 1).u64(~0ull).zeros(16);
  expect_error("keylen.gguf", kl, {"metadata key #0"});
  RawGguf a;
  a.header(0, 1).str("tokenizer.ggml.tokens").u32(9).u32(8).u64(1ull << 60);
  expect_error("arrlen.gguf", a, {"'tokenizer.ggml.tokens'", "array length"});
  RawGguf af;
  af.header(0, 1).str("x.f").u32(9).u32(6).u64(1000).zeros(16);
  expect_error("arrf32.gguf", af, {"'x.f'", "array length 1000"});
  RawGguf as;  // second string of an array lies about its length
  as.header(0, 1).str("x.s").u32(9).u32(8).u64(2).str("ok").u64(1ull << 40);
  expect_error("arrstr.gguf", as, {"'x.s'", "string #1"});
  RawGguf nest;  // arrays nested too deep
  nest.header(0, 1).str("x.n");
  nest.u32(9);
  for (int i = 0; i < 20; ++i) nest.u32(9).u64(1);
  nest.zeros(64);
  expect_error("nested.gguf", nest, {"'x.n'", "nested"});
  RawGguf dims;
  dims.header(1, 0).tensor("huge", {1ull << 62, 1ull << 62}, 0, 0);
  expect_error("dims.gguf", dims, {"'huge'", "overflows"});
  RawGguf big;
  big.header(1, 0).tensor("big.weight", {1ull << 40}, 0, 0).pad().zeros(32);
  expect_error("bigtensor.gguf", big, {"'big.weight'", "more than the whole file"});
}

TEST(GgufBad, ValueAndTensorProblems) {
  RawGguf vt;
  vt.header(0, 1).str("x.bad").u32(13).u32(0);
  expect_error("valtype.gguf", vt, {"'x.bad'", "unknown value type 13"});
  RawGguf et;
  et.header(0, 1).str("x.arr").u32(9).u32(77).u64(1);
  expect_error("elemtype.gguf", et, {"'x.arr'", "element type 77"});
  RawGguf bl;
  bl.header(0, 1).str("x.b").u32(7).pod<uint8_t>(2);
  expect_error("bool.gguf", bl, {"bool"});
  RawGguf dup;
  dup.header(0, 2).kv_u32("x.k", 1).kv_u32("x.k", 2);
  expect_error("dupkey.gguf", dup, {"duplicate metadata key 'x.k'"});

  RawGguf ty;
  ty.header(1, 0).tensor("blk.0.attn_q.weight", {32}, 99, 0).pad().zeros(128);
  expect_error("ttype.gguf", ty, {"'blk.0.attn_q.weight'", "unknown ggml tensor type id 99"});
  RawGguf removed;  // ids 4 and 5 were removed from ggml
  removed.header(1, 0).tensor("t", {32}, 4, 0).pad().zeros(128);
  expect_error("ttype4.gguf", removed, {"'t'", "type id 4"});
  RawGguf nd;
  nd.header(1, 0).tensor("t5", {1, 1, 1, 1, 1}, 0, 0).pad().zeros(32);
  expect_error("ndims.gguf", nd, {"'t5'", "n_dims 5"});
  RawGguf nd0;
  nd0.header(1, 0).tensor("t0", {}, 0, 0).pad().zeros(32);
  expect_error("ndims0.gguf", nd0, {"'t0'", "n_dims 0"});
  RawGguf blk;
  blk.header(1, 0).tensor("q.weight", {48}, 8, 0).pad().zeros(128);
  expect_error("block.gguf", blk, {"'q.weight'", "not a multiple of the Q8_0 block size 32"});
  RawGguf mxb;  // MXFP4 (id 39): 32-element blocks of 17 bytes
  mxb.header(1, 0).tensor("ffn_up_exps.weight", {48, 2}, 39, 0).pad().zeros(128);
  expect_error("mxblock.gguf", mxb, {"'ffn_up_exps.weight'", "not a multiple of the MXFP4 block size 32"});
  RawGguf mxs;  // 64 x 2 elements = 4 blocks = 68 bytes, 64 present
  mxs.header(1, 0).tensor("ffn_up_exps.weight", {64, 2}, 39, 0).pad().zeros(64);
  expect_error("mxsize.gguf", mxs, {"'ffn_up_exps.weight'", "past end of file"});
  RawGguf mxok;
  mxok.header(1, 0).tensor("ffn_up_exps.weight", {64, 2}, 39, 0).pad().zeros(68);
  EXPECT_EQ(open_error("mxok.gguf", mxok.b), "");
  RawGguf past;
  past.header(1, 0).tensor("blk.0.attn_q.weight", {16}, 0, 32).pad().zeros(64);
  expect_error("past.gguf", past, {"tensor 'blk.0.attn_q.weight': data [", "past end of file (size"});
  RawGguf far;
  far.header(1, 0).tensor("far", {8}, 0, ~0ull - 31).pad().zeros(32);
  expect_error("faroff.gguf", far, {"'far'"});
  RawGguf mis;
  mis.header(1, 0).tensor("mis", {1}, 0, 4).pad().zeros(64);
  expect_error("misaligned.gguf", mis, {"'mis'", "offset 4 is not a multiple of the alignment 32"});
  RawGguf dupt;
  dupt.header(2, 0).tensor("same", {8}, 0, 0).tensor("same", {8}, 0, 32).pad().zeros(64);
  expect_error("duptensor.gguf", dupt, {"duplicate tensor name 'same'"});
  RawGguf al;
  al.header(0, 1).kv_u32("general.alignment", 3);
  expect_error("align3.gguf", al, {"general.alignment", "power of two"});
  RawGguf al0;
  al0.header(0, 1).kv_u32("general.alignment", 0);
  expect_error("align0.gguf", al0, {"general.alignment"});
  // Past INT64_MAX as UINT64 (found by fuzz_gguf: it escaped as a
  // std::runtime_error), and negative as INT32: each refused with the key named.
  RawGguf alh;
  alh.header(0, 1).str("general.alignment").u32(10).u64(0xF700000000000040ull);
  expect_error("alignhuge.gguf", alh, {"general.alignment", "17798225727368200256", "power of two"});
  RawGguf aln;
  aln.header(0, 1).str("general.alignment").u32(5).u32(uint32_t(-32));
  expect_error("alignneg.gguf", aln, {"general.alignment", "-32", "power of two"});
  RawGguf als;
  als.header(0, 1).kv_str("general.alignment", "32");
  expect_error("alignstr.gguf", als, {"general.alignment"});

  // A custom alignment moves the data section and is honoured.
  RawGguf ok;
  ok.header(1, 1).kv_u32("general.alignment", 8).tensor("t", {2}, 0, 8).pad(8).zeros(16);
  EXPECT_EQ(open_error("align8.gguf", ok.b), "");
  // A vocab-only file may end right after its metadata (no padding).
  RawGguf vo;
  vo.header(0, 1).kv_str("general.architecture", "llama");
  EXPECT_EQ(open_error("vocabonly.gguf", vo.b), "");
}

TEST(GgufBad, NotAFile) {
  EXPECT_NE(model_error([] { GgufFile::open("/nonexistent/model.gguf"); }).find("/nonexistent/model.gguf"),
            std::string::npos);
  EXPECT_NE(model_error([] { GgufFile::open(temp_dir()); }).find("is a directory"), std::string::npos);
  EXPECT_NE(model_error([] { GgufFile::open("/dev/null"); }).find("not a regular file"), std::string::npos);
  EXPECT_THROW(GgufFile::parse(nullptr, 0, "null"), ModelError);
}

// `-m DIR` used to be read as a llama2.c checkpoint of absurd size: the
// loader says it is a directory and names the model files inside.
TEST(GgufBad, ModelLoadOfADirectorySaysSo) {
  const std::string dir = temp_dir() + "/model-dir";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/weights.gguf") << "x";
  const std::string e = model_error([&] { Model::load(dir); });
  EXPECT_NE(e.find("is a directory"), std::string::npos) << e;
  EXPECT_NE(e.find("weights.gguf"), std::string::npos) << e;
  EXPECT_EQ(e.find("too short"), std::string::npos) << e;
}

TEST(GgufBad, RandomMutationsNeverCrash) {
  // Byte flips and splices of a valid writer file: each parse either
  // succeeds (and every pointer it hands out is readable) or throws ModelError.
  GgufWriter w;
  w.set_str("general.architecture", "llama");
  w.set_str_array("tokenizer.ggml.tokens", {"<unk>", "a", "bb"});
  w.set_f32_array("tokenizer.ggml.scores", {0.f, -1.f, -2.f});
  w.set_value("x.nested", arr_items(GgufType::ARRAY, {arr_ints(GgufType::INT8, {1, 2})}));
  std::vector<float> x(64, 0.5f);
  w.add_tensor_f32("a", GgmlType::Q8_0, {32, 2}, x.data());
  w.add_tensor_f32("b", GgmlType::F16, {8}, x.data());
  const std::string p = tmp("mut_base.gguf");
  w.write(p);
  const auto base = read_bytes(p);
  std::mt19937 rng(11);
  int ok = 0, bad = 0;
  for (int it = 0; it < 20000; ++it) {
    std::vector<uint8_t> b = base;
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n; ++k) {
      const size_t pos = rng() % b.size();
      switch (rng() % 4) {
        case 0: b[pos] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
        case 1: b[pos] = static_cast<uint8_t>(rng()); break;
        case 2: b[pos] = 0xFF; break;
        case 3: b.resize(pos + 1); break;
      }
    }
    try {
      auto f = GgufFile::parse(b.data(), b.size(), "mut");
      touch_all(*f);
      ++ok;
    } catch (const ModelError&) {
      ++bad;
    }
  }
  EXPECT_GT(bad, 0);
  EXPECT_GT(ok, 0);
}

// ---- fuzz corpus replay ----------------------------------------------------------

TEST(GgufFuzzCorpus, ReplayEveryFile) {
  const fs::path dir = fs::path(__FILE__).parent_path().parent_path() / "fuzz" / "corpus" / "gguf";
  if (!fs::exists(dir)) GTEST_SKIP() << dir << " missing";
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const auto b = read_bytes(e.path().string());
    SCOPED_TRACE(e.path().string());
    try {
      auto f = GgufFile::parse(b.data(), b.size(), e.path().filename().string());
      touch_all(*f);
    } catch (const ModelError&) {
    }
    ++n;
  }
  EXPECT_GT(n, 0);
}

// Regenerates fuzz/corpus/gguf (run with --gtest_also_run_disabled_tests
// --gtest_filter='*WriteFuzzSeeds*'). Small files made by our writer, each
// reaching a different part of the parser; under 10 KB each.
TEST(GgufFuzzCorpus, DISABLED_WriteFuzzSeeds) {
  const fs::path dir = fs::path(__FILE__).parent_path().parent_path() / "fuzz" / "corpus" / "gguf";
  fs::create_directories(dir);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 0.1f);
  auto randv = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
  };
  {  // every metadata value type, no tensors
    GgufWriter w;
    w.set_value("a.u8", val(GgufType::UINT8, uint64_t(1)));
    w.set_value("a.i8", val(GgufType::INT8, int64_t(-1)));
    w.set_value("a.u16", val(GgufType::UINT16, uint64_t(2)));
    w.set_value("a.i16", val(GgufType::INT16, int64_t(-2)));
    w.set_u32("a.u32", 3);
    w.set_i32("a.i32", -3);
    w.set_f32("a.f32", 0.5f);
    w.set_bool("a.bool", true);
    w.set_str("a.str", "text");
    w.set_u64("a.u64", 4);
    w.set_value("a.i64", val(GgufType::INT64, int64_t(-4)));
    w.set_value("a.f64", val(GgufType::FLOAT64, 0.25));
    w.set_str_array("a.strs", {"x", "yz"});
    w.set_f32_array("a.f32s", {1.f, 2.f});
    w.set_i32_array("a.i32s", {1, -1});
    w.set_value("a.bools", arr_items(GgufType::BOOL, {val(GgufType::BOOL, false)}));
    w.set_value("a.nested", arr_items(GgufType::ARRAY, {arr_ints(GgufType::UINT16, {5, 6})}));
    w.write((dir / "meta_all_types.gguf").string());
  }
  auto tiny = [&](const std::string& arch, bool bias, GgmlType t, const std::string& file, int64_t d) {
    // dim d, 1 layer, 2 heads (1 KV), ffn d, vocab 8.
    GgufWriter w;
    w.set_str("general.architecture", arch);
    const std::string a = arch + ".";
    w.set_u32(a + "embedding_length", static_cast<uint32_t>(d));
    w.set_u32(a + "block_count", 1);
    w.set_u32(a + "attention.head_count", 2);
    w.set_u32(a + "attention.head_count_kv", 1);
    w.set_u32(a + "feed_forward_length", static_cast<uint32_t>(d));
    w.set_u32(a + "context_length", 64);
    w.set_f32(a + "attention.layer_norm_rms_epsilon", 1e-5f);
    w.set_str("tokenizer.ggml.model", "llama");
    w.set_str_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a", "b", "\xE2\x96\x81" "a", "ab", "ba"});
    w.set_f32_array("tokenizer.ggml.scores", {0, 0, 0, -1, -2, -3, -4, -5});
    w.set_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 1, 1});
    w.set_u32("tokenizer.ggml.bos_token_id", 1);
    w.set_u32("tokenizer.ggml.eos_token_id", 2);
    auto m = [&](const std::string& n, int64_t rows, int64_t cols) { w.add_tensor_f32(n, t, {cols, rows}, randv(rows * cols).data()); };
    auto v = [&](const std::string& n, int64_t len) { w.add_tensor_f32(n, GgmlType::F32, {len}, std::vector<float>(len, 1.f).data()); };
    m("token_embd.weight", 8, d);
    v("output_norm.weight", d);
    v("blk.0.attn_norm.weight", d);
    m("blk.0.attn_q.weight", d, d);
    m("blk.0.attn_k.weight", d / 2, d);
    m("blk.0.attn_v.weight", d / 2, d);
    if (bias) {
      v("blk.0.attn_q.bias", d);
      v("blk.0.attn_k.bias", d / 2);
      v("blk.0.attn_v.bias", d / 2);
    }
    m("blk.0.attn_output.weight", d, d);
    v("blk.0.ffn_norm.weight", d);
    m("blk.0.ffn_gate.weight", d, d);
    m("blk.0.ffn_up.weight", d, d);
    m("blk.0.ffn_down.weight", d, d);
    w.write((dir / file).string());
  };
  tiny("llama", false, GgmlType::Q4_0, "tiny_llama_q4_0.gguf", 32);
  tiny("qwen2", true, GgmlType::Q8_0, "tiny_qwen2_q8_0.gguf", 32);
  tiny("llama", false, GgmlType::F16, "tiny_llama_f16.gguf", 16);
  {  // K-quant and small types with a 64-byte alignment
    GgufWriter w;
    w.set_u32("general.alignment", 64);
    w.add_tensor_f32("k4", GgmlType::Q4_K, {256}, randv(256).data());
    w.add_tensor_f32("k5", GgmlType::Q5_K, {256}, randv(256).data());
    w.add_tensor_f32("k6", GgmlType::Q6_K, {256}, randv(256).data());
    w.add_tensor_f32("q41", GgmlType::Q4_1, {32, 2}, randv(64).data());
    w.add_tensor_f32("q50", GgmlType::Q5_0, {32}, randv(32).data());
    w.add_tensor_f32("q51", GgmlType::Q5_1, {32, 1, 1}, randv(32).data());
    w.add_tensor_f32("bf", GgmlType::BF16, {4, 2, 1, 1}, randv(8).data());
    w.write((dir / "kquants_align64.gguf").string());
  }
  {  // gpt2-style vocabulary only
    GgufWriter w;
    w.set_str("general.architecture", "gpt2");
    w.set_str("tokenizer.ggml.model", "gpt2");
    w.set_str("tokenizer.ggml.pre", "gpt-2");
    w.set_str_array("tokenizer.ggml.tokens", {"a", "b", "ab", "\xC4\xA0", "\xC4\xA0" "a"});
    w.set_str_array("tokenizer.ggml.merges", {"a b", "\xC4\xA0 a"});
    w.set_i32_array("tokenizer.ggml.token_type", {1, 1, 1, 1, 1});
    w.set_u32("tokenizer.ggml.bos_token_id", 0);
    w.set_str("tokenizer.chat_template", "{{ messages }}");
    w.write((dir / "vocab_gpt2.gguf").string());
  }
  for (const auto& e : fs::directory_iterator(dir)) EXPECT_LT(fs::file_size(e.path()), 10240u) << e.path();
}
