// map_large (kernels/huge_pages.h): the buffers the kernels stream (packed
// weights, the KV pool, activations) start on a 2 MiB boundary when large,
// are zeroed and writable, and are backed by huge pages where the kernel's
// transparent huge page setting allows a request (skipped, with the
// reason, where it does not).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "kernels/huge_pages.h"
#include "kernels/weight_pack.h"

namespace kvs {
namespace {

constexpr size_t kHuge = size_t(2) << 20;

// Why huge pages cannot be granted here, or "".
std::string thp_missing() {
  if (!huge_pages_requested()) return "KVS_HUGE_PAGES=0 is set";
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!in || !std::getline(in, line)) return "no /sys/kernel/mm/transparent_hugepage/enabled";
  if (line.find("[never]") != std::string::npos) return "transparent huge pages are off ([never])";
  return "";
}

TEST(HugePages, LargeBuffersAreAlignedZeroedAndHuge) {
  const size_t bytes = 3 * kHuge + 12345;  // not a whole number of pages
  auto* p = static_cast<uint8_t*>(map_large(bytes));
  ASSERT_NE(p, nullptr);
  if (huge_pages_requested()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kHuge, 0u);
  }
  for (size_t i = 0; i < bytes; i += 4096) ASSERT_EQ(p[i], 0) << i;
  ASSERT_EQ(p[bytes - 1], 0);
  std::memset(p, 0x5a, bytes);  // every byte writable
  const std::string why = thp_missing();
  const size_t huge = huge_bytes_in(p, bytes);
  unmap_large(p, bytes);
  if (!why.empty()) GTEST_SKIP() << why;
  // The kernel may be short of free huge pages; it grants none at all only
  // when the request was never made.
  EXPECT_GT(huge, 0u) << "no huge page behind a touched, madvised, aligned buffer";
}

TEST(HugePages, SmallBuffersArePlainPages) {
  auto* p = static_cast<uint8_t*>(map_large(100));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  EXPECT_EQ(p[99], 0);
  p[99] = 1;
  unmap_large(p, 100);
  EXPECT_THROW(map_large(0), std::bad_alloc);
}

TEST(HugePages, PackedArenaUsesThem) {
  const std::string why = thp_missing();
  PackedArena a(5 * kHuge);
  std::memset(a.data(), 1, a.size());
  const size_t huge = huge_bytes_in(a.data(), a.size());
  if (!why.empty()) GTEST_SKIP() << why;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % kHuge, 0u);
  EXPECT_GT(huge, 0u);
}

// The engine's activation vectors: the heap below a huge page, map_large
// from one up, the contents kept across growth either way.
TEST(HugePages, LargeVecGrowsAcrossTheThreshold) {
  LargeVec<float> v(1000, 1.5f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % 64, 0u);
  v.resize(size_t(3) << 20, 2.5f);  // 12 MiB
  if (huge_pages_requested()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % kHuge, 0u);
  }
  EXPECT_EQ(v[999], 1.5f);
  EXPECT_EQ(v[1000], 2.5f);
  EXPECT_EQ(v.back(), 2.5f);
  v.resize(10);
  v.shrink_to_fit();
  EXPECT_EQ(v[9], 1.5f);
}

}  // namespace
}  // namespace kvs
