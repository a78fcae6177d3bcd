// Registry semantics with an explicit clock: upsert, per-entry expiry, retention, goodbye,
// restarts, static instances, limits, and snapshot sharing.
#include "discovery/registry.h"

#include <gtest/gtest.h>

namespace pdr::discovery {
namespace {

using namespace std::chrono_literals;

proto::Registration moriio(std::string host, uint16_t port, proto::Role role = proto::Role::kPrefill) {
  proto::Registration r;
  r.format = proto::RegistrationFormat::kMoriio;
  r.role = role;
  r.http_address = {std::move(host), port};
  r.zmq_address = "host:" + r.http_address.host + ",handshake:6301,notify:61005";
  r.connector = proto::Connector::kMoriio;
  r.transfer_mode = proto::TransferMode::kWrite;
  r.dp_size = 2;
  r.tp_size = 4;
  return r;
}

RegistryOptions opts() {
  RegistryOptions o;
  o.default_ttl = 5000ms;
  o.min_ttl = 1000ms;
  o.max_ttl = 60000ms;
  o.expired_retention = 10000ms;
  o.max_instances = 3;
  return o;
}

const Clock::time_point t0 = Clock::time_point(std::chrono::hours(1000));

TEST(Registry, HeartbeatUpdatesLivenessWithoutANewSnapshot) {
  Registry reg(opts());
  EXPECT_EQ(reg.upsert(moriio("127.0.10.1", 8000), t0).result, UpsertResult::kAdded);
  EXPECT_TRUE(reg.dirty());
  auto snap = reg.snapshot(t0);
  EXPECT_FALSE(reg.dirty());
  ASSERT_EQ(snap->instances.size(), 1u);
  const Instance* inst = snap->instances[0].get();
  EXPECT_EQ(inst->key, "127.0.10.1:8000");
  EXPECT_EQ(inst->dp_size, 2u);
  EXPECT_EQ(inst->state, InstanceState::kUp);
  EXPECT_EQ(inst->expires_at(), t0 + 5s);

  auto hb = moriio("127.0.10.1", 8000);
  hb.load = {true, 3, 1, 900};
  EXPECT_EQ(reg.upsert(hb, t0 + 3s).result, UpsertResult::kUpdated);
  EXPECT_FALSE(reg.dirty()) << "a plain heartbeat must not require a snapshot";
  // The published snapshot sees the node's live cell: newest liveness, same object.
  EXPECT_EQ(inst->messages(), 2u);
  EXPECT_EQ(inst->last_seen(), t0 + 3s);
  EXPECT_EQ(inst->expires_at(), t0 + 8s);
  EXPECT_EQ(inst->load().running, 3u);
  EXPECT_EQ(reg.snapshot(t0 + 3s)->instances[0].get(), inst);
}

TEST(Registry, FieldChangeIsStructural) {
  Registry reg(opts());
  reg.upsert(moriio("127.0.10.1", 8000), t0);
  (void)reg.snapshot(t0);
  auto changed = moriio("127.0.10.1", 8000);
  changed.transfer_mode = proto::TransferMode::kRead;
  reg.upsert(changed, t0 + 1s);
  EXPECT_TRUE(reg.dirty());
}

TEST(Registry, ChangedInstanceIsCopiedOthersShared) {
  Registry reg(opts());
  reg.upsert(moriio("127.0.10.1", 8000), t0);
  reg.upsert(moriio("127.0.10.2", 8000), t0);
  auto a = reg.snapshot(t0);
  auto changed = moriio("127.0.10.2", 8000);
  changed.dp_size = 4;
  reg.upsert(changed, t0 + 1s);
  auto b = reg.snapshot(t0 + 1s);
  EXPECT_EQ(a->instances[0].get(), b->instances[0].get());  // untouched: same object
  EXPECT_NE(a->instances[1].get(), b->instances[1].get());  // changed: new object
  EXPECT_EQ(a->instances[1]->dp_size, 2u);                  // the old snapshot is immutable
  EXPECT_EQ(b->instances[1]->dp_size, 4u);
  EXPECT_EQ(a->instances[1]->liveness, b->instances[1]->liveness);  // one live cell per node
}

TEST(Registry, ManyHeartbeatsKeepTheHeapBounded) {
  Registry reg(opts());
  for (int i = 0; i < 1000; ++i) reg.upsert(moriio("127.0.10.1", 8000), t0 + std::chrono::milliseconds(i));
  // One instance, deadlines only extended: expiry must happen at the last beat + TTL, once.
  EXPECT_EQ(reg.expire_due(t0 + 5s).expired, 0u);
  EXPECT_EQ(reg.expire_due(t0 + 999ms + 4999ms).expired, 0u);
  EXPECT_EQ(reg.expire_due(t0 + 999ms + 5s).expired, 1u);
}

TEST(Registry, ExpiryFollowsEachInstancesOwnDeadlineNotInsertionOrder) {
  Registry reg(opts());
  reg.upsert(moriio("127.0.10.1", 8000), t0);       // inserted first, then kept alive
  reg.upsert(moriio("127.0.10.2", 8000), t0 + 1s);  // inserted second, never refreshed
  reg.upsert(moriio("127.0.10.1", 8000), t0 + 4s);  // deadline now t0+9s
  ASSERT_TRUE(reg.next_deadline().has_value());
  EXPECT_LE(*reg.next_deadline(), t0 + 6s);  // never later than the true next event
  EXPECT_EQ(reg.expire_due(t0 + 5999ms).expired, 0u);
  EXPECT_LE(*reg.next_deadline(), t0 + 6s);
  auto r = reg.expire_due(t0 + 6s);
  EXPECT_EQ(r.expired, 1u);
  auto snap = reg.snapshot(t0 + 6s);
  EXPECT_EQ(snap->find("127.0.10.1:8000")->state, InstanceState::kUp);
  EXPECT_EQ(snap->find("127.0.10.2:8000")->state, InstanceState::kExpired);
  // Retention: the expired entry disappears after expired_retention.
  EXPECT_EQ(reg.expire_due(t0 + 6s + 9999ms).removed, 0u);
  EXPECT_EQ(reg.expire_due(t0 + 16s).removed, 1u);
  EXPECT_EQ(reg.snapshot(t0 + 16s)->find("127.0.10.2:8000"), nullptr);
}

TEST(Registry, ExpiredInstanceComesBackAsRevived) {
  Registry reg(opts());
  reg.upsert(moriio("127.0.10.1", 8000), t0);
  reg.expire_due(t0 + 5s);
  EXPECT_EQ(reg.upsert(moriio("127.0.10.1", 8000), t0 + 6s).result, UpsertResult::kRevived);
  EXPECT_EQ(reg.snapshot(t0 + 6s)->instances[0]->state, InstanceState::kUp);
  EXPECT_EQ(reg.expire_due(t0 + 10999ms).expired, 0u);  // the retention deadline is superseded
  EXPECT_EQ(reg.expire_due(t0 + 11s).expired, 1u);
}

TEST(Registry, RequestedTtlIsClamped) {
  Registry reg(opts());
  auto r = moriio("127.0.10.1", 8000);
  r.ttl_ms = 10;
  EXPECT_EQ(reg.upsert(r, t0).ttl, 1000ms);
  r.ttl_ms = 10'000'000;
  EXPECT_EQ(reg.upsert(r, t0).ttl, 60000ms);
  r.ttl_ms = 7000;
  EXPECT_EQ(reg.upsert(r, t0).ttl, 7000ms);
  EXPECT_EQ(reg.expire_due(t0 + 6999ms).expired, 0u);
  EXPECT_EQ(reg.expire_due(t0 + 7s).expired, 1u);
}

TEST(Registry, NewEpochCountsAsRestart) {
  Registry reg(opts());
  auto r = moriio("127.0.10.1", 8000);
  r.format = proto::RegistrationFormat::kPdrouter;
  r.schema_version = 1;
  r.epoch = 100;
  reg.upsert(r, t0);
  EXPECT_EQ(reg.upsert(r, t0 + 1s).result, UpsertResult::kUpdated);
  // The workers had ejected the old process (connects failed); the restart clears that.
  auto before = reg.snapshot(t0 + 1s);
  before->instances[0]->liveness->connect_failures = 3;
  before->instances[0]->liveness->ejected_until_ns = INT64_MAX;
  r.epoch = 200;
  EXPECT_EQ(reg.upsert(r, t0 + 2s).result, UpsertResult::kRestarted);
  auto snap = reg.snapshot(t0 + 2s);
  EXPECT_EQ(snap->instances[0]->liveness->connect_failures.load(), 0u);
  EXPECT_EQ(snap->instances[0]->liveness->ejected_until_ns.load(), 0);
  EXPECT_EQ(snap->instances[0]->restarts, 1u);
  EXPECT_EQ(snap->instances[0]->epoch, 200u);
  EXPECT_EQ(snap->instances[0]->first_seen, t0 + 2s);
}

TEST(Registry, GoodbyeRemovesAtOnceButNotFromAnOlderEpoch) {
  Registry reg(opts());
  auto r = moriio("127.0.10.1", 8000);
  r.epoch = 200;
  reg.upsert(r, t0);
  proto::Goodbye stale{{"127.0.10.1", 8000}, 1, "", 100, ""};
  EXPECT_EQ(reg.goodbye(stale, t0), GoodbyeResult::kStaleEpoch);
  EXPECT_EQ(reg.size(), 1u);
  proto::Goodbye bye{{"127.0.10.1", 8000}, 1, "", 200, ""};
  EXPECT_EQ(reg.goodbye(bye, t0), GoodbyeResult::kRemoved);
  EXPECT_EQ(reg.size(), 0u);
  const auto later = reg.expire_due(t0 + 1h);  // its old deadline is gone with it
  EXPECT_EQ(later.expired + later.removed, 0u);
  EXPECT_EQ(reg.goodbye(bye, t0), GoodbyeResult::kUnknown);
}

TEST(Registry, FullRegistryEvictsExpiredFirstThenRejects) {
  Registry reg(opts());  // max 3
  reg.upsert(moriio("127.0.10.1", 1), t0);
  reg.upsert(moriio("127.0.10.2", 1), t0 + 1s);
  reg.upsert(moriio("127.0.10.3", 1), t0 + 1s);
  EXPECT_EQ(reg.upsert(moriio("127.0.10.4", 1), t0 + 2s).result, UpsertResult::kRejectedFull);
  reg.expire_due(t0 + 5s);  // 127.0.10.1 expired
  EXPECT_EQ(reg.upsert(moriio("127.0.10.4", 1), t0 + 5s).result, UpsertResult::kAdded);
  auto snap = reg.snapshot(t0 + 5s);
  EXPECT_EQ(snap->instances.size(), 3u);
  EXPECT_EQ(snap->find("127.0.10.1:1"), nullptr);
}

TEST(Registry, StaticInstancesNeverExpireAndTakeLivenessFromHeartbeats) {
  Registry reg(opts());
  config::StaticInstance s;
  s.role = proto::Role::kDecode;
  s.http_address = {"127.0.10.9", 8000};
  s.connector = proto::Connector::kMoriio;
  s.transfer_mode = proto::TransferMode::kRead;
  s.zmq_address = "host:127.0.10.9,handshake:6301,notify:61005";
  reg.replace_static({s}, t0);
  auto snap = reg.snapshot(t0);
  ASSERT_EQ(snap->instances.size(), 1u);
  EXPECT_EQ(snap->instances[0]->source, InstanceSource::kStatic);
  ASSERT_TRUE(snap->instances[0]->moriio_zmq.has_value());
  EXPECT_EQ(snap->instances[0]->moriio_zmq->notify_port, 61005);

  auto hb = moriio("127.0.10.9", 8000, proto::Role::kPrefill);  // node claims another role
  reg.upsert(hb, t0 + 1s);
  snap = reg.snapshot(t0 + 1s);
  EXPECT_EQ(snap->instances[0]->role, proto::Role::kDecode);  // the operator's word stands
  EXPECT_EQ(snap->instances[0]->last_seen(), t0 + 1s);
  EXPECT_EQ(reg.expire_due(t0 + 1h).expired, 0u);

  reg.replace_static({}, t0 + 2s);  // removed from the file
  EXPECT_EQ(reg.snapshot(t0 + 2s)->instances.size(), 0u);
}

TEST(Registry, RepeatedRegistrationPublishesNothingAnyChangedFieldDoes) {
  Registry reg(opts());
  auto r = moriio("127.0.10.1", 8000);
  r.model = "m";
  r.labels = {{"zone", "a"}};
  reg.upsert(r, t0);
  (void)reg.snapshot(t0);
  reg.upsert(r, t0 + 1s);
  EXPECT_FALSE(reg.dirty());
  auto labelled = r;
  labelled.labels = {{"zone", "b"}};
  reg.upsert(labelled, t0 + 2s);
  EXPECT_TRUE(reg.dirty());
  EXPECT_EQ(reg.snapshot(t0 + 2s)->instances[0]->labels, labelled.labels);
  auto other_model = labelled;
  other_model.model = "n";
  reg.upsert(other_model, t0 + 3s);
  EXPECT_TRUE(reg.dirty());
  EXPECT_EQ(reg.snapshot(t0 + 3s)->instances[0]->model, "n");
}

TEST(Registry, ReloadingTheSameStaticListPublishesNothingAChangedEntryDoes) {
  Registry reg(opts());
  config::StaticInstance s;
  s.role = proto::Role::kDecode;
  s.http_address = {"127.0.10.9", 8000};
  s.connector = proto::Connector::kP2pNccl;
  s.zmq_address = "127.0.10.9:21001";
  reg.replace_static({s}, t0);
  auto first = reg.snapshot(t0);
  ASSERT_TRUE(first->instances[0]->kv_address.has_value());
  EXPECT_EQ(first->instances[0]->kv_address->port, 21001);
  reg.replace_static({s}, t0 + 1s);
  EXPECT_FALSE(reg.dirty());
  s.labels = {{"rack", "7"}};
  reg.replace_static({s}, t0 + 2s);
  EXPECT_TRUE(reg.dirty());
  auto second = reg.snapshot(t0 + 2s);
  EXPECT_EQ(second->instances[0]->labels, s.labels);
  EXPECT_EQ(second->instances[0]->liveness, first->instances[0]->liveness);
}

TEST(Registry, DrainingFlagSetsState) {
  Registry reg(opts());
  auto r = moriio("127.0.10.1", 8000);
  r.draining = true;
  reg.upsert(r, t0);
  auto snap = reg.snapshot(t0);
  EXPECT_EQ(snap->instances[0]->state, InstanceState::kDraining);
  EXPECT_EQ(snap->count(proto::Role::kPrefill, InstanceState::kDraining), 1u);
  EXPECT_EQ(snap->count(proto::Role::kPrefill, InstanceState::kUp), 0u);
}

// ---- admission (discovery/config/admission.h) ---------------------------------------------------

config::StaticInstance static_decode(std::string host, uint16_t port) {
  config::StaticInstance s;
  s.role = proto::Role::kDecode;
  s.http_address = {std::move(host), port};
  s.connector = proto::Connector::kNixl;
  return s;
}

TEST(RegistryAdmission, WeakerSenderCannotChangeOrRemoveAStrongerEntry) {
  Registry reg(opts());
  auto legit = moriio("127.0.0.1", 8000, proto::Role::kDecode);
  legit.epoch = 7;
  ASSERT_EQ(reg.upsert(legit, t0, config::AdmissionClass::kToken).result, UpsertResult::kAdded);
  reg.snapshot(t0);
  // The attack: a token-less vLLM message for the same address.
  auto rogue = moriio("127.0.0.1", 8000, proto::Role::kPrefill);
  rogue.zmq_address = "host:127.0.0.66,handshake:1,notify:2";
  EXPECT_EQ(reg.upsert(rogue, t0 + 1s, config::AdmissionClass::kAddress).result, UpsertResult::kRejectedWeaker);
  EXPECT_FALSE(reg.dirty());
  const auto snap = reg.snapshot(t0 + 1s);
  ASSERT_EQ(snap->instances.size(), 1u);
  EXPECT_EQ(snap->instances[0]->role, proto::Role::kDecode);
  EXPECT_EQ(snap->instances[0]->zmq_address, legit.zmq_address);
  EXPECT_EQ(snap->instances[0]->last_seen(), t0);  // not even its liveness
  proto::Goodbye bye{{"127.0.0.1", 8000}, 1, "", 7, ""};
  EXPECT_EQ(reg.goodbye(bye, t0 + 1s, config::AdmissionClass::kAddress), GoodbyeResult::kWeaker);
  EXPECT_EQ(reg.goodbye(bye, t0 + 1s, config::AdmissionClass::kCurve), GoodbyeResult::kRemoved);
}

TEST(RegistryAdmission, StrongerSenderTakesTheEntryOver) {
  Registry reg(opts());
  reg.upsert(moriio("127.0.0.1", 8000), t0, config::AdmissionClass::kAddress);
  EXPECT_EQ(reg.count_by_class()[static_cast<size_t>(config::AdmissionClass::kAddress)], 1u);
  reg.upsert(moriio("127.0.0.1", 8000), t0 + 1s, config::AdmissionClass::kCurve);
  const auto snap = reg.snapshot(t0 + 1s);
  EXPECT_EQ(snap->instances[0]->admission, config::AdmissionClass::kCurve);
  EXPECT_EQ(snap->count_by_class[static_cast<size_t>(config::AdmissionClass::kAddress)], 0u);
  EXPECT_EQ(snap->count_by_class[static_cast<size_t>(config::AdmissionClass::kCurve)], 1u);
  EXPECT_EQ(reg.upsert(moriio("127.0.0.1", 8000), t0 + 2s, config::AdmissionClass::kAddress).result,
            UpsertResult::kRejectedWeaker);
}

TEST(RegistryAdmission, GoodbyesNeverTouchOperatorEntries) {
  Registry reg(opts());
  reg.replace_static({static_decode("127.0.0.1", 8000)}, t0);
  proto::Goodbye bye{{"127.0.0.1", 8000}, 1, "", 0, ""};
  EXPECT_EQ(reg.goodbye(bye, t0, config::AdmissionClass::kCurve), GoodbyeResult::kOperatorOwned);
  EXPECT_EQ(reg.snapshot(t0)->instances[0]->state, InstanceState::kUp);
}

TEST(RegistryAdmission, OnlyAnAuthenticatedNodeDrainsAnOperatorEntry) {
  Registry reg(opts());
  reg.replace_static({static_decode("127.0.0.1", 8000)}, t0);
  auto hb = moriio("127.0.0.1", 8000, proto::Role::kDecode);
  hb.draining = true;
  reg.upsert(hb, t0 + 1s, config::AdmissionClass::kAddress);
  EXPECT_EQ(reg.snapshot(t0 + 1s)->instances[0]->state, InstanceState::kUp);
  EXPECT_EQ(reg.snapshot(t0 + 1s)->instances[0]->last_seen(), t0 + 1s);  // liveness still counts
  reg.upsert(hb, t0 + 2s, config::AdmissionClass::kToken);
  EXPECT_EQ(reg.snapshot(t0 + 2s)->instances[0]->state, InstanceState::kDraining);
}

TEST(RegistryAdmission, OlderEpochIsNotARestartAndGoodbyeNeedsTheCurrentEpoch) {
  Registry reg(opts());
  auto r = moriio("127.0.0.1", 8000);
  r.epoch = 6;
  reg.upsert(r, t0);
  r.epoch = 1;
  EXPECT_EQ(reg.upsert(r, t0 + 1s).result, UpsertResult::kRejectedStaleEpoch);
  EXPECT_EQ(reg.snapshot(t0 + 1s)->instances[0]->restarts, 0u);
  proto::Goodbye bye{{"127.0.0.1", 8000}, 1, "", 0, ""};  // no epoch
  EXPECT_EQ(reg.goodbye(bye, t0 + 1s), GoodbyeResult::kStaleEpoch);
  bye.epoch = 7;  // a newer one is not ours either
  EXPECT_EQ(reg.goodbye(bye, t0 + 1s), GoodbyeResult::kStaleEpoch);
  bye.epoch = 6;
  EXPECT_EQ(reg.goodbye(bye, t0 + 1s), GoodbyeResult::kRemoved);
}

TEST(RegistryAdmission, CapPerClassKeepsRoomForStrongerSenders) {
  RegistryOptions o = opts();
  o.max_instances = 100;
  o.max_per_class = {2, 2, 2, 2};
  Registry reg(o);
  reg.upsert(moriio("127.0.0.1", 1), t0, config::AdmissionClass::kOpen);
  reg.upsert(moriio("127.0.0.1", 2), t0 + 1s, config::AdmissionClass::kOpen);
  EXPECT_EQ(reg.upsert(moriio("127.0.0.1", 3), t0 + 1s, config::AdmissionClass::kOpen).result,
            UpsertResult::kRejectedClassFull);
  EXPECT_EQ(reg.upsert(moriio("127.0.0.1", 3), t0 + 1s, config::AdmissionClass::kCurve).result, UpsertResult::kAdded);
  // An expired entry of the full class makes room (the one expired longest goes).
  reg.expire_due(t0 + 5s);  // :1 expired
  EXPECT_EQ(reg.upsert(moriio("127.0.0.1", 4), t0 + 5s, config::AdmissionClass::kOpen).result, UpsertResult::kAdded);
  const auto snap = reg.snapshot(t0 + 5s);
  EXPECT_EQ(snap->find("127.0.0.1:1"), nullptr);
  EXPECT_NE(snap->find("127.0.0.1:2"), nullptr);
  EXPECT_EQ(snap->count_by_class[static_cast<size_t>(config::AdmissionClass::kOpen)], 2u);
}

TEST(RegistryAdmission, RevivedAndRemovedEntriesLeaveTheEvictionIndex) {
  Registry reg(opts());  // max 3
  reg.upsert(moriio("127.0.0.1", 1), t0);
  reg.expire_due(t0 + 5s);
  reg.upsert(moriio("127.0.0.1", 1), t0 + 6s);  // revived: no longer evictable
  reg.upsert(moriio("127.0.0.1", 2), t0 + 6s);
  reg.upsert(moriio("127.0.0.1", 3), t0 + 6s);
  EXPECT_EQ(reg.upsert(moriio("127.0.0.1", 4), t0 + 6s).result, UpsertResult::kRejectedFull);
  EXPECT_EQ(reg.size(), 3u);
}

}  // namespace
}  // namespace pdr::discovery
