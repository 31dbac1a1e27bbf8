
namespace {

// The figures of docs/ON-DEVICE.md: the bench model (kvs-bench-1.1b at
// Q4_0) under 256 MiB, 512 MiB and 1 GiB, for a chat and for a server of
// 64 sequences.
TEST(RamBudget, BenchModelFigures) {
  RamBudgetInput in;
  in.model = priced_shape(find_preset("kvs-bench-1.1b"), WeightQuant::Q4_0);
  for (uint64_t mib : {256, 512}) {
    in.budget_bytes = mib << 20;
    EXPECT_THROW(choose_for_budget(in), std::runtime_error) << mib;
  }
  in.budget_bytes = 1ull << 30;
  RamBudgetChoice c = choose_for_budget(in);
  EXPECT_EQ(c.kv_type, KvType::Int8);
  EXPECT_EQ(c.hard_cap, 2048);
  EXPECT_EQ(int64_t(c.kv_bytes_per_token), 19456);
  EXPECT_EQ(int64_t(c.mha_bytes_per_token), 77824);
  in.want_batch = 64;
  c = choose_for_budget(in);
  EXPECT_EQ(c.kv_type, KvType::Int4);
  EXPECT_EQ(int64_t(c.kv_bytes_per_token), 11264);
  EXPECT_EQ(c.batch, 14);
}

}  // namespace
