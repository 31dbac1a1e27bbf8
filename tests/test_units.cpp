// Strict parsing and formatting of sizes, bandwidths and FLOP rates
// (tools/units.h) for the plan and probe commands.
#include <gtest/gtest.h>

#include <stdexcept>

#include "tools/units.h"

using namespace kvs::tools;

// ---- units -----------------------------------------------------------------------

TEST(Units, ParseSize) {
  EXPECT_EQ(parse_size("24GiB"), 24ull << 30);
  EXPECT_EQ(parse_size("512MiB"), 512ull << 20);
  EXPECT_EQ(parse_size("80GB"), 80000000000ull);
  EXPECT_EQ(parse_size("1.5GiB"), 1610612736ull);
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("4096B"), 4096u);
  EXPECT_EQ(parse_size("2kB"), 2000u);
  for (const char* bad : {"", "GiB", "24 GiB", "24gib", "24GIB", "24Gb", "-1GiB", "+5", "1e9", "1.5", "0x10",
                          "24GiBs", "1..5GiB", "1.GiB", ".5GiB", "inf", "99999999999TiB"})
    EXPECT_THROW(parse_size(bad), std::invalid_argument) << bad;
}

TEST(Units, ParseRates) {
  EXPECT_DOUBLE_EQ(parse_bandwidth("80GB/s"), 80e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("25.6GiB/s"), 27487790694.0);  // rounded to whole bytes
  EXPECT_DOUBLE_EQ(parse_bandwidth("900MB"), 900e6);
  for (const char* bad : {"", "80", "80/s", "0GB/s", "80GB/h", "80Gb/s", "fast"})
    EXPECT_THROW(parse_bandwidth(bad), std::invalid_argument) << bad;
  EXPECT_DOUBLE_EQ(parse_flops("1T"), 1e12);
  EXPECT_DOUBLE_EQ(parse_flops("1.5TFLOPS"), 1.5e12);
  EXPECT_DOUBLE_EQ(parse_flops("800G"), 800e9);
  EXPECT_DOUBLE_EQ(parse_flops("2000"), 2000);
  for (const char* bad : {"", "T", "0", "1X", "1TB", "-1T", "1 T", "1TFLOP"})
    EXPECT_THROW(parse_flops(bad), std::invalid_argument) << bad;
}

TEST(Units, Formatting) {
  EXPECT_EQ(format_bytes(327680), "320 KiB");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_int(327680), "327,680");
  EXPECT_EQ(format_int(-1234567), "-1,234,567");
  EXPECT_EQ(format_si(80e9, "B/s"), "80 GB/s");
}
