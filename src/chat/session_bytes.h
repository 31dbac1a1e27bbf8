// Length-prefixed little records for a chat snapshot (strings, integers,
// byte blobs). The bytes exist only in memory: session_store seals them
// before anything reaches a disk.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvs::chat {

class ByteWriter {
 public:
  void u32(uint32_t v);
  void i64(int64_t v);
  void str(const std::string& s);
  void blob(const std::vector<uint8_t>& b);
  std::vector<uint8_t>& bytes() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

// Throws std::invalid_argument on a truncated or malformed record.
class ByteReader {
 public:
  explicit ByteReader(const std::vector<uint8_t>& in) : in_(in) {}
  uint32_t u32();
  int64_t i64();
  std::string str();
  std::vector<uint8_t> blob();
  bool done() const { return at_ == in_.size(); }

 private:
  const std::vector<uint8_t>& in_;
  size_t at_ = 0;
  void get(void* p, size_t n);
};

}  // namespace kvs::chat
