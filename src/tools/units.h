// Strict parsing and friendly printing of the quantities the planning tools
// take on the command line: memory sizes ("24GiB"), bandwidths ("80GB/s") and
// compute rates ("1T"). A typo must be an error, never a silently different
// number, so anything not matching the grammar below throws
// std::invalid_argument with the accepted forms.
#pragma once
#include <cstdint>
#include <string>

namespace kvs::tools {

// <number>[<unit>] with number = digits[.digits], no sign, no spaces.
// Units: B (or none) = bytes; KiB MiB GiB TiB = powers of 1024;
// KB MB GB TB = powers of 1000 (k/K both accepted for kilo). Case matters
// for the i ("GiB", not "GIB"); "Gb" (bits) is rejected. Fractions are allowed
// when the result is a whole number of bytes after rounding to nearest.
uint64_t parse_size(const std::string& s);
// A size per second: "<size>/s" (e.g. "80GB/s", "25.6GiB/s"); the "/s" may be
// omitted but the unit may not ("80" is rejected). Returns bytes per second.
double parse_bandwidth(const std::string& s);
// A rate of operations: "<number>[K|M|G|T|P][FLOPS|FLOP/s|OPS|OP/s]"
// (decimal prefixes), e.g. "1T", "1.5TFLOPS", "800G". Returns ops per second.
double parse_flops(const std::string& s);

// 327680 -> "320 KiB", 137953296384 -> "128.48 GiB" (binary, 2 decimals max).
std::string format_bytes(double bytes);
// 8.0e10 -> "80 GB/s" style decimal prefixes: format_si(8e10, "B/s").
std::string format_si(double v, const std::string& unit);
// Thousands separators: 327680 -> "327,680".
std::string format_int(int64_t v);
// A speed ratio: 1.2749 -> "1.27x".
std::string format_ratio(double r);

}  // namespace kvs::tools
