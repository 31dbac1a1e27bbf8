// The --kv-memory option: how many bytes the paged KV pool may take, either
// an absolute size ("2GiB", "512MiB", "1500000000") or a share of the memory
// available now ("40%", "0.4" = 40% of MemAvailable in /proc/meminfo). The
// pool is allocated once at start-up, so "free RAM" is read once, here.
#pragma once
#include <cstdint>
#include <string>

namespace kvs::tools {

// Bytes the kernel reports as available (MemAvailable); throws
// std::runtime_error when /proc/meminfo cannot be read.
uint64_t available_memory_bytes();

// Parses the option; `available` is MemAvailable (pass it in tests). A share
// must be in (0, 1] (or (0%, 100%]); throws std::invalid_argument naming
// the accepted forms.
uint64_t parse_kv_memory(const std::string& s, uint64_t available);
// Same, reading MemAvailable only when the option is a share.
uint64_t parse_kv_memory(const std::string& s);

}  // namespace kvs::tools
