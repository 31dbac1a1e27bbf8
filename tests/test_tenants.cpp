// Tenants without sockets: the api-keys file, bearer authentication (the
// scheme in any case), cache scopes (per tenant, per permission version, per
// retention epoch), revoke and the block quota.
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "server/tenants.h"

using namespace kvs;
using namespace kvs::server;
using nlohmann::json;

namespace {

std::unique_ptr<TenantRegistry> registry() {
  const json keys = {{"keys",
                      {{{"key_sha256", sha256_hex("key-a")}, {"tenant", "a"}, {"quota_blocks", 10}},
                       {{"key_sha256", sha256_hex("key-a2")}, {"tenant", "a"}, {"quota_blocks", 10}},
                       {{"key_sha256", sha256_hex("key-b")},
                        {"tenant", "b"},
                        {"class", "batch"},
                        {"retention_s", 5},
                        {"admin", true}}}}};
  return TenantRegistry::from_json(keys.dump(), "keys.json");
}

std::string load_error(const json& j) {
  try {
    TenantRegistry::from_json(j.dump(), "keys.json");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Tenants, AnonymousWithoutKeys) {
  TenantRegistry r;
  EXPECT_FALSE(r.auth_required());
  auto c = r.authenticate("");
  ASSERT_TRUE(c);
  EXPECT_EQ(c->policy.id, "anonymous");
  EXPECT_EQ(c->tenant_hash, tenant_hash("anonymous"));
}

TEST(Tenants, BearerSchemeIsCaseInsensitive) {
  auto r = registry();
  EXPECT_TRUE(r->auth_required());
  for (const char* h : {"Bearer key-a", "bearer key-a", "BEARER key-a", "bEaReR   key-a  ", "Bearer\tkey-a"}) {
    auto c = r->authenticate(h);
    ASSERT_TRUE(c) << h;
    EXPECT_EQ(c->policy.id, "a") << h;
  }
  EXPECT_EQ(r->authenticate("Bearer key-a2")->policy.id, "a");  // a second key of one tenant
  for (const char* h : {"", "key-a", "Bearer", "Bearer ", "Bearerkey-a", "Basic key-a", "Bearer key-c",
                        "Bearer key-a extra", "Token key-a"})
    EXPECT_FALSE(r->authenticate(h)) << h;
}

TEST(Tenants, PolicyFromTheFile) {
  auto r = registry();
  const auto b = r->authenticate("Bearer key-b");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->policy.slo, sched::SloClass::Batch);
  EXPECT_EQ(b->policy.retention_s, 5);
  EXPECT_TRUE(b->policy.admin);
  EXPECT_EQ(b->tenant_hash.size(), 16u);
  EXPECT_EQ(b->tenant_hash.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(b->tenant_hash, tenant_hash("b"));
  EXPECT_NE(tenant_hash("a"), tenant_hash("b"));
  EXPECT_FALSE(r->policy("nobody"));
  EXPECT_EQ(r->policy("a")->quota_blocks, 10);
}

TEST(Tenants, BadFilesNameTheField) {
  EXPECT_NE(load_error(json::object()).find("keys"), std::string::npos);
  EXPECT_NE(load_error({{"keys", {{{"key_sha256", "abc"}, {"tenant", "a"}}}}}).find("key_sha256"), std::string::npos);
  EXPECT_NE(load_error({{"keys", {{{"key_sha256", sha256_hex("k")}, {"tenant", ""}}}}}).find("tenant"),
            std::string::npos);
  EXPECT_NE(load_error({{"keys", {{{"key_sha256", sha256_hex("k")}, {"tenant", "a"}, {"class", "vip"}}}}}).find("class"),
            std::string::npos);
  // One tenant listed twice with different settings is refused.
  EXPECT_NE(load_error({{"keys",
                         {{{"key_sha256", sha256_hex("k1")}, {"tenant", "a"}, {"quota_blocks", 1}},
                          {{"key_sha256", sha256_hex("k2")}, {"tenant", "a"}, {"quota_blocks", 2}}}}})
                .find("different settings"),
            std::string::npos);
  // The key itself never appears in an error.
  const std::string e = load_error({{"keys", {{{"key_sha256", "zz" + sha256_hex("k").substr(2)}, {"tenant", "a"}}}}});
  EXPECT_NE(e.find("non-hex"), std::string::npos);
  EXPECT_THROW(TenantRegistry::from_json("not json", "keys.json"), std::runtime_error);
}

TEST(Tenants, ScopesDifferPerTenantVersionAndModel) {
  auto r = registry();
  const Scope a1 = r->scope_for("a", "model-x", 0);
  EXPECT_EQ(r->scope_for("a", "model-x", 1), a1);
  EXPECT_NE(r->scope_for("b", "model-x", 1), a1);
  EXPECT_NE(r->scope_for("a", "model-y", 1), a1);
  std::vector<Scope> retired;
  EXPECT_EQ(r->revoke("a", &retired), 2);
  EXPECT_NE(std::find(retired.begin(), retired.end(), a1), retired.end());
  EXPECT_NE(r->scope_for("a", "model-x", 2), a1);
  EXPECT_FALSE(r->revoke("nobody"));
  // Another secret: other scopes for the same tenant.
  auto other = registry();
  other->set_secret(std::vector<uint8_t>(32, 7));
  EXPECT_NE(other->scope_for("b", "model-x", 0), r->scope_for("b", "model-x", 0));
  EXPECT_THROW(other->set_secret(std::vector<uint8_t>(8, 1)), std::runtime_error);
}

TEST(Tenants, RetentionStartsANewEpochAfterIdling) {
  auto r = registry();  // b has a retention, a has none
  const Scope s0 = r->scope_for("b", "m", 100);
  EXPECT_EQ(r->scope_for("b", "m", 104), s0);  // used within retention
  EXPECT_EQ(r->scope_for("b", "m", 108), s0);  // each use restarts the idle time
  EXPECT_NE(r->scope_for("b", "m", 114), s0);  // idle longer than retention_s
  const Scope a = r->scope_for("a", "m", 0);   // a has no retention
  EXPECT_EQ(r->scope_for("a", "m", 1e6), a);
}

TEST(Tenants, BlockQuota) {
  auto r = registry();  // a has a block quota, b has none
  EXPECT_TRUE(r->try_reserve("a", 6));
  EXPECT_FALSE(r->try_reserve("a", 5));
  EXPECT_TRUE(r->try_reserve("a", 4));
  EXPECT_EQ(r->reserved("a"), 10);
  r->release("a", 6);
  EXPECT_EQ(r->reserved("a"), 4);
  r->release("a", 100);
  EXPECT_EQ(r->reserved("a"), 0);
  EXPECT_TRUE(r->try_reserve("b", 1000));  // no quota
}
