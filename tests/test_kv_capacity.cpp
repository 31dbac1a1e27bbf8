// KV capacity arithmetic (kv/capacity.h), shared by `kvserve plan` and
// admission: bytes per token against figures computed by hand from public
// model cards, block and headroom arithmetic, and the exact estimate.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "kernels/kv_layout.h"
#include "kv/capacity.h"

using namespace kvs;

// ---- KV bytes per token ------------------------------------------------------

TEST(KvCapacity, BytesPerTokenPublicModels) {
  // Llama-2-70B: 2 × 80 layers × 8 KV heads × 128 × 2 B = 327,680 B = 320 KiB.
  EXPECT_EQ(kv_bytes_per_token(80, 8, 128, KvFormat::f16()), 327680u);
  // Llama-2-7B is MHA: 2 × 32 × 32 × 128 × 2 = 524,288.
  EXPECT_EQ(kv_bytes_per_token(32, 32, 128, KvFormat::f16()), 524288u);
  // Llama-3-8B: 2 × 32 × 8 × 128 × 2 = 131,072.
  EXPECT_EQ(kv_bytes_per_token(32, 8, 128, KvFormat::f16()), 131072u);
  // Qwen2.5-7B: 2 × 28 × 4 × 128 × 2 = 57,344.
  EXPECT_EQ(kv_bytes_per_token(28, 4, 128, KvFormat::f16()), 57344u);
  EXPECT_EQ(kv_bytes_per_token(80, 8, 128, KvFormat::bf16()), 327680u);
  EXPECT_EQ(kv_bytes_per_token(80, 8, 128, KvFormat::f32()), 655360u);
}

TEST(KvCapacity, QuantizedFormatsPayScales) {
  // int8/g32: 128 B payload + 4 groups × 2 B scale = 136 B per row.
  EXPECT_EQ(KvFormat::int8().row_bytes(128), 136u);
  EXPECT_EQ(kv_bytes_per_token(80, 8, 128, KvFormat::int8()), 2u * 80 * 8 * 136);  // 174,080
  // int4/g32: 64 B payload + 4 groups × (scale + min) 4 B = 80 B per row.
  EXPECT_EQ(KvFormat::int4().row_bytes(128), 80u);
  EXPECT_EQ(kv_bytes_per_token(80, 8, 128, KvFormat::int4()), 102400u);
  // Group size is a parameter; a partial last group still pays a scale.
  EXPECT_EQ(KvFormat::int8(64).row_bytes(128), 132u);
  EXPECT_EQ(KvFormat::int8(32).row_bytes(40), 40u + 2 * 2);
  EXPECT_EQ(KvFormat::int4(32).row_bytes(7), 4u + 4);  // odd int4 rows round the nibble up
  EXPECT_THROW(KvFormat::int8(0).row_bytes(128), std::invalid_argument);
}

TEST(KvCapacity, F32MatchesEngineLayout) {
  // The planner and the engine's block layout must agree on the f32 cache.
  KvLayout l{5, 4, 8, 16};
  EXPECT_EQ(kv_bytes_per_token(5, 4, 8, KvFormat::f32()), l.bytes_per_token());
  EXPECT_EQ(kv_bytes_per_token(5, 4, 8, KvFormat::f32()) * 16, l.block_bytes());
}

TEST(KvCapacity, ParseKvFormat) {
  EXPECT_EQ(parse_kv_format("f16").dtype, KvDtype::F16);
  EXPECT_EQ(parse_kv_format("BF16").dtype, KvDtype::BF16);
  EXPECT_EQ(parse_kv_format("int8").group_size, 32);
  EXPECT_EQ(parse_kv_format("int8/g64").group_size, 64);
  EXPECT_EQ(parse_kv_format("int4:128").group_size, 128);
  EXPECT_EQ(parse_kv_format("q4").dtype, KvDtype::Int4);
  EXPECT_EQ(parse_kv_format("int8").name(), "int8/g32");
  for (const char* bad : {"", "f8", "int8/g", "int8/g0", "int8/gx", "f16/g32", "int4:-1", "int8/g1234567"})
    EXPECT_THROW(parse_kv_format(bad), std::invalid_argument) << bad;
}

// ---- blocks and capacity -----------------------------------------------------

TEST(KvCapacity, BlockArithmetic) {
  EXPECT_EQ(blocks_for_tokens(0, 16), 0);
  EXPECT_EQ(blocks_for_tokens(1, 16), 1);
  EXPECT_EQ(blocks_for_tokens(16, 16), 1);
  EXPECT_EQ(blocks_for_tokens(17, 16), 2);
  EXPECT_THROW(blocks_for_tokens(5, 0), std::invalid_argument);
  EXPECT_THROW(blocks_for_tokens(-1, 16), std::invalid_argument);
  // 1000 + 500 tokens = 94 blocks; a 1000-token prompt has 62 full blocks to share.
  EXPECT_EQ(request_blocks(1000, 500, 16), 94);
  EXPECT_EQ(request_blocks(1000, 500, 16, 62), 32);
  EXPECT_THROW(request_blocks(1000, 500, 16, 63), std::invalid_argument);
  EXPECT_THROW(request_blocks(-1, 5, 16), std::invalid_argument);
  EXPECT_EQ(headroom_blocks(2560, 0.05), 128);
  EXPECT_EQ(headroom_blocks(4373, 0.05), 219);  // ceil(218.65)
  EXPECT_EQ(headroom_blocks(100, 0.0), 0);
  EXPECT_THROW(headroom_blocks(100, 1.0), std::invalid_argument);
  EXPECT_THROW(headroom_blocks(100, -0.1), std::invalid_argument);
}

TEST(KvCapacity, EstimateExact) {
  CapacityInput in;
  in.mem_budget_bytes = 10ull << 30;
  in.weight_bytes = 4ull << 30;
  in.scratch_bytes = 1ull << 30;
  in.headroom_fraction = 0.05;
  in.block_size = 16;
  in.kv_bytes_per_token = 131072;  // Llama-3-8B f16: one block = 2 MiB
  in.prompt_tokens = 1000;
  in.max_tokens = 500;
  const CapacityResult r = estimate_capacity(in);
  EXPECT_EQ(r.bytes_per_block, 2u << 20);
  EXPECT_EQ(r.kv_budget_bytes, 5ull << 30);
  EXPECT_EQ(r.total_blocks, 2560);
  EXPECT_EQ(r.headroom_blocks, 128);
  EXPECT_EQ(r.usable_blocks, 2432);
  EXPECT_EQ(r.blocks_per_request, 94);
  EXPECT_EQ(r.max_concurrent_sequences, 25);  // 25 × 94 = 2350 <= 2432 < 26 × 94
  EXPECT_EQ(r.max_tokens_resident, 2432 * 16);
  in.cached_prefix_blocks = 62;  // shared prompt: only 32 new blocks each
  EXPECT_EQ(estimate_capacity(in).max_concurrent_sequences, 76);
}

TEST(KvCapacity, BudgetTooSmallIsAClearError) {
  CapacityInput in;
  in.mem_budget_bytes = 8ull << 30;
  in.weight_bytes = 13477363712;  // Llama-2-7B f16
  in.kv_bytes_per_token = 524288;
  in.prompt_tokens = 10;
  in.max_tokens = 10;
  try {
    estimate_capacity(in);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cannot hold the weights"), std::string::npos) << m;
    EXPECT_NE(m.find("13477363712"), std::string::npos) << m;
  }
  in.mem_budget_bytes = in.weight_bytes;  // exactly the weights: still no room
  EXPECT_THROW(estimate_capacity(in), std::invalid_argument);
  in.kv_bytes_per_token = 0;
  EXPECT_THROW(estimate_capacity(in), std::invalid_argument);
}
