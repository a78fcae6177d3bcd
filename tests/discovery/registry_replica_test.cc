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
  EXPECT_EQ(r.upsert_replica(reg("127.0.20.1", 8000), {}, t0).result, AdminResult::kCreated);
  r.expire_due(t0 + 1h);
  auto snap = r.snapshot(t0 + 1h);
  ASSERT_EQ(snap->instances.size(), 1u);
  EXPECT_EQ(snap->instances[0]->source, InstanceSource::kReplica);
  EXPECT_EQ(snap->instances[0]->state, InstanceState::kUp);
  EXPECT_EQ(to_string(InstanceSource::kReplica), "replica");

  proto::Registration draining = reg("127.0.20.1", 8000);
  draining.draining = true;
  EXPECT_EQ(r.upsert_replica(draining, {}, t0).result, AdminResult::kOk);
  EXPECT_TRUE(r.dirty());
  EXPECT_EQ(r.snapshot(t0)->instances[0]->state, InstanceState::kDraining);
  // The same again changes nothing a snapshot shows.
  EXPECT_EQ(r.upsert_replica(draining, {}, t0).result, AdminResult::kOk);
  EXPECT_FALSE(r.dirty());
  // A local operator drain outlives the owner's undrain.
  ASSERT_EQ(r.set_operator_drain("127.0.20.1:8000", true).result, AdminResult::kOk);
  EXPECT_EQ(r.upsert_replica(reg("127.0.20.1", 8000), {}, t0).result, AdminResult::kOk);
  EXPECT_EQ(r.snapshot(t0)->instances[0]->state, InstanceState::kDraining);
}

TEST(RegistryReplica, RemoveReplicaTouchesOnlyReplicaEntries) {
  Registry r = registry();
  ASSERT_EQ(r.upsert(reg("127.0.20.2", 8000), t0).result, UpsertResult::kAdded);
  EXPECT_EQ(r.remove_replica("127.0.20.2:8000").result, AdminResult::kNotFound);
  EXPECT_EQ(r.remove_replica("127.0.20.3:8000").result, AdminResult::kNotFound);
  ASSERT_EQ(r.upsert_replica(reg("127.0.20.3", 8000), {}, t0).result, AdminResult::kCreated);
  EXPECT_EQ(r.remove_replica("127.0.20.3:8000").result, AdminResult::kOk);
  EXPECT_EQ(r.size(), 1u);
  // A goodbye sent to this replica does not remove another replica's entry.
  ASSERT_EQ(r.upsert_replica(reg("127.0.20.3", 8000), {}, t0).result, AdminResult::kCreated);
  proto::Goodbye bye;
  bye.http_address = {"127.0.20.3", 8000};
  bye.epoch = 1;
  EXPECT_EQ(r.goodbye(bye, t0), GoodbyeResult::kOperatorOwned);
}

TEST(RegistryReplica, LocalEntriesWinAndALocalRegistrationTakesAReplicaEntryOver) {
  Registry r = registry();
  ASSERT_EQ(r.upsert(reg("127.0.20.4", 8000), t0).result, UpsertResult::kAdded);
  EXPECT_EQ(r.upsert_replica(reg("127.0.20.4", 8000, 2), {}, t0).result, AdminResult::kConflict);
  EXPECT_EQ(r.snapshot(t0)->instances[0]->source, InstanceSource::kRegistered);

  ASSERT_EQ(r.upsert_replica(reg("127.0.20.5", 8000), {}, t0).result, AdminResult::kCreated);
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

// The weaker-sender rule holds across replicas: the class a node was admitted with on the replica
// that owns its entry travels with the entry (proto/etcd_registry_entry.h).
TEST(RegistryReplica, AWeakerLocalSenderCannotReplaceAStrongerReplicaEntry) {
  using config::AdmissionClass;
  Registry r = registry();
  const ReplicaOrigin curve{AdmissionClass::kCurve, false};
  ASSERT_EQ(r.upsert_replica(reg("127.0.20.6", 8000), curve, t0).result, AdminResult::kCreated);
  EXPECT_EQ(to_string(curve), "curve");
  proto::Registration evil = reg("127.0.20.6", 8000, 9);
  evil.role = proto::Role::kPrefill;
  evil.model = "evil";
  for (AdmissionClass weaker : {AdmissionClass::kOpen, AdmissionClass::kAddress, AdmissionClass::kToken}) {
    EXPECT_EQ(r.upsert(evil, t0 + 1s, weaker).result, UpsertResult::kRejectedWeaker) << config::to_string(weaker);
  }
  auto snap = r.snapshot(t0 + 1s);
  const Instance* inst = snap->find("127.0.20.6:8000");
  ASSERT_NE(inst, nullptr);
  EXPECT_EQ(inst->source, InstanceSource::kReplica);
  EXPECT_EQ(inst->admission, AdmissionClass::kCurve);
  EXPECT_EQ(inst->role, proto::Role::kDecode);
  EXPECT_EQ(inst->model, "");
  // The node itself (as strong) moving to this replica takes its entry over, as before.
  EXPECT_EQ(r.upsert(reg("127.0.20.6", 8000, 2), t0 + 2s, AdmissionClass::kCurve).result, UpsertResult::kAdded);
  snap = r.snapshot(t0 + 2s);
  EXPECT_EQ(snap->find("127.0.20.6:8000")->source, InstanceSource::kRegistered);
  EXPECT_EQ(snap->find("127.0.20.6:8000")->admission, AdmissionClass::kCurve);
}

TEST(RegistryReplica, AStrongerReplicaEntryReplacesAWeakerLocalOne) {
  using config::AdmissionClass;
  Registry r = registry();
  // A weaker sender registered here before the owner's entry arrived.
  ASSERT_EQ(r.upsert(reg("127.0.20.7", 8000), t0, AdmissionClass::kAddress).result, UpsertResult::kAdded);
  ASSERT_EQ(r.count_by_class()[static_cast<size_t>(AdmissionClass::kAddress)], 1u);
  EXPECT_EQ(r.upsert_replica(reg("127.0.20.7", 8000), {AdmissionClass::kCurve, false}, t0).result,
            AdminResult::kReplaced);
  auto snap = r.snapshot(t0);
  EXPECT_EQ(snap->find("127.0.20.7:8000")->source, InstanceSource::kReplica);
  EXPECT_EQ(r.count_by_class()[static_cast<size_t>(AdmissionClass::kAddress)], 0u);
  EXPECT_EQ(r.upsert(reg("127.0.20.7", 8000), t0 + 1s, AdmissionClass::kAddress).result, UpsertResult::kRejectedWeaker);
  // Equal classes: what this replica sees itself wins, as before.
  ASSERT_EQ(r.upsert(reg("127.0.20.8", 8000), t0, AdmissionClass::kToken).result, UpsertResult::kAdded);
  EXPECT_EQ(r.upsert_replica(reg("127.0.20.8", 8000), {AdmissionClass::kToken, false}, t0).result,
            AdminResult::kConflict);
}

TEST(RegistryReplica, AnOperatorEntryOfTheOwnerOnlyTakesLivenessFromNodesHere) {
  using config::AdmissionClass;
  Registry r = registry();
  const ReplicaOrigin op{AdmissionClass::kOpen, true};
  EXPECT_EQ(to_string(op), "operator");
  ASSERT_EQ(r.upsert_replica(reg("127.0.20.9", 8000), op, t0).result, AdminResult::kCreated);
  (void)r.snapshot(t0);
  proto::Registration beat = reg("127.0.20.9", 8000, 3);
  beat.model = "other";
  EXPECT_EQ(r.upsert(beat, t0 + 1s, AdmissionClass::kCurve).result, UpsertResult::kUpdated);
  EXPECT_FALSE(r.dirty());
  auto snap = r.snapshot(t0 + 1s);
  const Instance* inst = snap->find("127.0.20.9:8000");
  EXPECT_EQ(inst->source, InstanceSource::kReplica);
  EXPECT_TRUE(inst->replica_of_operator_entry);
  EXPECT_EQ(inst->model, "");
  EXPECT_EQ(inst->last_seen(), t0 + 1s);
  // And it replaces a registered entry of any class here.
  ASSERT_EQ(r.upsert(reg("127.0.20.10", 8000), t0, AdmissionClass::kCurve).result, UpsertResult::kAdded);
  EXPECT_EQ(r.upsert_replica(reg("127.0.20.10", 8000), op, t0).result, AdminResult::kReplaced);
}

TEST(RegistryReplica, AClassChangeOfTheOwnersEntryIsShownAndApplied) {
  using config::AdmissionClass;
  Registry r = registry();
  ASSERT_EQ(r.upsert_replica(reg("127.0.20.11", 8000), {AdmissionClass::kAddress, false}, t0).result,
            AdminResult::kCreated);
  (void)r.snapshot(t0);
  EXPECT_EQ(r.upsert_replica(reg("127.0.20.11", 8000), {AdmissionClass::kCurve, false}, t0).result, AdminResult::kOk);
  EXPECT_TRUE(r.dirty());
  EXPECT_EQ(r.snapshot(t0)->find("127.0.20.11:8000")->admission, AdmissionClass::kCurve);
  EXPECT_EQ(r.upsert(reg("127.0.20.11", 8000), t0, AdmissionClass::kAddress).result, UpsertResult::kRejectedWeaker);
}

TEST(ReplicaOrigin, NamesRoundTripAndUnknownNamesAreTheWeakestClass) {
  using config::AdmissionClass;
  for (const char* name : {"open", "address", "token", "curve", "operator"}) {
    EXPECT_EQ(to_string(parse_replica_origin(name)), name);
  }
  // Written by an older replica (no class), or unknown: nothing proven, the weakest class.
  EXPECT_EQ(parse_replica_origin(""), (ReplicaOrigin{AdmissionClass::kOpen, false}));
  EXPECT_EQ(parse_replica_origin("root"), (ReplicaOrigin{AdmissionClass::kOpen, false}));
  EXPECT_EQ(parse_replica_origin("Curve"), (ReplicaOrigin{AdmissionClass::kOpen, false}));
}

}  // namespace
}  // namespace pdr::discovery
