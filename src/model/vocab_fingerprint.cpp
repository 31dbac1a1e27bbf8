#include "model/vocab_fingerprint.h"

#include <cstring>

#include "model/loaders.h"

namespace kvs {

namespace {

// Length-prefixed, so that no two different vocabularies serialize alike.
void put(std::string& out, const std::string& s) {
  out += std::to_string(s.size());
  out += ':';
  out += s;
}

void put_num(std::string& out, long long v) { put(out, std::to_string(v)); }

}  // namespace

std::string vocab_fingerprint(const Vocab& v) {
  std::string s;
  put_num(s, int(v.kind));
  put(s, v.pre);
  put_num(s, (long long)v.tokens.size());
  for (const std::string& t : v.tokens) put(s, t);
  put_num(s, (long long)v.scores.size());
  for (const float f : v.scores) {
    char b[sizeof f];
    std::memcpy(b, &f, sizeof f);  // exact bits: a text form could round two scores alike
    s.append(b, sizeof b);
  }
  put_num(s, (long long)v.types.size());
  for (const int32_t t : v.types) put_num(s, t);
  put_num(s, (long long)v.merges.size());
  for (const std::string& m : v.merges) put(s, m);
  put_num(s, (long long)v.strip.size());
  for (const uint8_t b : v.strip) put_num(s, b);
  for (const long long x : {(long long)v.bos, (long long)v.eos, (long long)v.unk, (long long)v.pad,
                            (long long)v.add_bos, (long long)v.add_eos, (long long)v.add_space_prefix,
                            (long long)v.llama2c})
    put_num(s, x);
  return "vocab-v1:" + detail::sha256_hex(s);
}

}  // namespace kvs
