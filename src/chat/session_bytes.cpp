#include "chat/session_bytes.h"

#include <cstring>
#include <stdexcept>

namespace kvs::chat {

void ByteWriter::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) out_.push_back(uint8_t(v >> (8 * i)));
}

void ByteWriter::i64(int64_t v) {
  for (int i = 0; i < 8; ++i) out_.push_back(uint8_t(uint64_t(v) >> (8 * i)));
}

void ByteWriter::str(const std::string& s) {
  i64(int64_t(s.size()));
  out_.insert(out_.end(), s.begin(), s.end());
}

void ByteWriter::blob(const std::vector<uint8_t>& b) {
  i64(int64_t(b.size()));
  out_.insert(out_.end(), b.begin(), b.end());
}

void ByteReader::get(void* p, size_t n) {
  if (n > in_.size() - at_) throw std::invalid_argument("session snapshot is truncated");
  if (n == 0) return;  // p may be null (an empty blob)
  std::memcpy(p, in_.data() + at_, n);
  at_ += n;
}

uint32_t ByteReader::u32() {
  uint8_t b[4];
  get(b, 4);
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(b[i]) << (8 * i);
  return v;
}

int64_t ByteReader::i64() {
  uint8_t b[8];
  get(b, 8);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(b[i]) << (8 * i);
  return int64_t(v);
}

std::string ByteReader::str() {
  const int64_t n = i64();
  if (n < 0 || uint64_t(n) > in_.size() - at_) throw std::invalid_argument("session snapshot is malformed");
  std::string s(static_cast<size_t>(n), '\0');
  get(s.data(), size_t(n));
  return s;
}

std::vector<uint8_t> ByteReader::blob() {
  const int64_t n = i64();
  if (n < 0 || uint64_t(n) > in_.size() - at_) throw std::invalid_argument("session snapshot is malformed");
  std::vector<uint8_t> b(static_cast<size_t>(n));
  get(b.data(), size_t(n));
  return b;
}

}  // namespace kvs::chat
