// Entries learnt from other pdrouter replicas (registry.backend: etcd): created and refreshed by
// upsert_replica, never expired locally, removed by remove_replica only, outranked by local
// entries, and taken over by a local registration of the same node without a gap.
#include <gtest/gtest.h>

#include "discovery/registry.h"

namespace pdr::discovery {
namespace {

using namespace std::chrono_literals;

const Clock::time_point t0 = Clock::time_point(std::chrono::hours(1000));

proto::Registration reg(std::string host, uint16_t port, uint64_t epoch = 1) {
  proto::Registration r;
  r.format = proto::RegistrationFormat::kPdrouter;
  r.schema_version = 1;
  r.role = proto::Role::kDecode;
  r.http_address = {std::move(host), port};
  r.connector = proto::Connector::kNixl;
  r.epoch = epoch;
  return r;
}

Registry registry() {
  RegistryOptions o;
  o.default_ttl = 5000ms;
  return Registry(o);
}

TEST(RegistryReplica, ReplicaEntriesNeverExpireLocallyAndFollowTheOwnersDrainFlag) {
  Registry r = registry();
  EXPECT_EQ(r.upsert_replica(reg("127.0.20.1", 8000), t0).result, AdminResult::kCreated);
  r.expire_due(t0 + 1h);
  auto snap = r.snapshot(t0 + 1h);
  ASSERT_EQ(snap->instances.size(), 1u);
  EXPECT_EQ(snap->instances[0]->source, InstanceSource::kReplica);
  EXPECT_EQ(snap->instances[0]->state, InstanceState::kUp);
  EXPECT_EQ(to_string(InstanceSource::kReplica), "replica");

  proto::Registration draining = reg("127.0.20.1", 8000);
  draining.draining = true;
  EXPECT_EQ(r.upsert_replica(draining, t0).result, AdminResult::kOk);
  EXPECT_TRUE(r.dirty());
  EXPECT_EQ(r.snapshot(t0)->instances[0]->state, InstanceState::kDraining);
  // The same again changes nothing a snapshot shows.
  EXPECT_EQ(r.upsert_replica(draining, t0).result, AdminResult::kOk);
  EXPECT_FALSE(r.dirty());
  // A local operator drain outlives the owner's undrain.
  ASSERT_EQ(r.set_operator_drain("127.0.20.1:8000", true).result, AdminResult::kOk);
  EXPECT_EQ(r.upsert_replica(reg("127.0.20.1", 8000), t0).result, AdminResult::kOk);
  EXPECT_EQ(r.snapshot(t0)->instances[0]->state, InstanceState::kDraining);
}

TEST(RegistryReplica, RemoveReplicaTouchesOnlyReplicaEntries) {
  Registry r = registry();
  ASSERT_EQ(r.upsert(reg("127.0.20.2", 8000), t0).result, UpsertResult::kAdded);
  EXPECT_EQ(r.remove_replica("127.0.20.2:8000").result, AdminResult::kNotFound);
  EXPECT_EQ(r.remove_replica("127.0.20.3:8000").result, AdminResult::kNotFound);
  ASSERT_EQ(r.upsert_replica(reg("127.0.20.3", 8000), t0).result, AdminResult::kCreated);
  EXPECT_EQ(r.remove_replica("127.0.20.3:8000").result, AdminResult::kOk);
  EXPECT_EQ(r.size(), 1u);
  // A goodbye sent to this replica does not remove another replica's entry.
  ASSERT_EQ(r.upsert_replica(reg("127.0.20.3", 8000), t0).result, AdminResult::kCreated);
  proto::Goodbye bye;
  bye.http_address = {"127.0.20.3", 8000};
  bye.epoch = 1;
  EXPECT_EQ(r.goodbye(bye, t0), GoodbyeResult::kOperatorOwned);
}

TEST(RegistryReplica, LocalEntriesWinAndALocalRegistrationTakesAReplicaEntryOver) {
  Registry r = registry();
  ASSERT_EQ(r.upsert(reg("127.0.20.4", 8000), t0).result, UpsertResult::kAdded);
  EXPECT_EQ(r.upsert_replica(reg("127.0.20.4", 8000, 2), t0).result, AdminResult::kConflict);
  EXPECT_EQ(r.snapshot(t0)->instances[0]->source, InstanceSource::kRegistered);

  ASSERT_EQ(r.upsert_replica(reg("127.0.20.5", 8000), t0).result, AdminResult::kCreated);
  (void)r.snapshot(t0);
  // The node now registers here: one snapshot shows it registered, never absent.
  EXPECT_EQ(r.upsert(reg("127.0.20.5", 8000), t0 + 1s).result, UpsertResult::kAdded);
  auto snap = r.snapshot(t0 + 1s);
  const Instance* inst = snap->find("127.0.20.5:8000");
  ASSERT_NE(inst, nullptr);
  EXPECT_EQ(inst->source, InstanceSource::kRegistered);
  EXPECT_EQ(inst->state, InstanceState::kUp);
  // And, registered now, it expires with its own TTL.
  r.expire_due(t0 + 1s + 6s);
  EXPECT_EQ(r.snapshot(t0 + 7s)->find("127.0.20.5:8000")->state, InstanceState::kExpired);
}

}  // namespace
}  // namespace pdr::discovery
