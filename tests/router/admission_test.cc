// AdmissionSlot (router/proxy/admission.h): what an admitted request holds is given back exactly
// once, whichever way it ends. The refusals themselves run against real sims in
// tests/integration/test_endpoints.py (OneNodeAdmission) and test_proxy_requests.py.
#include "router/proxy/admission.h"

#include <gtest/gtest.h>

#include <optional>
#include <utility>

namespace pdr::router::proxy {
namespace {

// What admission (admit_or_queue) counts before it hands out a slot.
AdmissionSlot take(ProxyCounters& c, size_t bytes) {
  c.in_flight.fetch_add(1);
  EXPECT_TRUE(c.buffered.reserve(bytes, 0));
  return AdmissionSlot(c, bytes);
}

TEST(AdmissionSlot, ReleaseGivesBothBackOnce) {
  ProxyCounters c;
  AdmissionSlot slot = take(c, 100);
  EXPECT_TRUE(slot.held());
  EXPECT_EQ(c.in_flight.load(), 1);
  EXPECT_EQ(c.buffered.held.load(), 100);
  slot.release();
  EXPECT_FALSE(slot.held());
  EXPECT_EQ(c.in_flight.load(), 0);
  EXPECT_EQ(c.buffered.held.load(), 0);
  slot.release();  // a second end (a close after a failure) takes nothing more
  EXPECT_EQ(c.in_flight.load(), 0);
  EXPECT_EQ(c.buffered.held.load(), 0);
}

TEST(AdmissionSlot, DestructionReleasesWhatWasNotReleased) {
  ProxyCounters c;
  {
    AdmissionSlot slot = take(c, 7);
    EXPECT_EQ(c.in_flight.load(), 1);
  }
  EXPECT_EQ(c.in_flight.load(), 0);
  EXPECT_EQ(c.buffered.held.load(), 0);
  {
    AdmissionSlot slot = take(c, 7);
    slot.release();
  }
  EXPECT_EQ(c.in_flight.load(), 0);
  EXPECT_EQ(c.buffered.held.load(), 0);
}

TEST(AdmissionSlot, MovesCarryTheSlot) {
  ProxyCounters c;
  std::optional<AdmissionSlot> taken = take(c, 5);
  AdmissionSlot holder;
  EXPECT_FALSE(holder.held());
  holder = *std::move(taken);
  taken.reset();  // the moved-from slot gives nothing back
  EXPECT_EQ(c.in_flight.load(), 1);
  AdmissionSlot other = take(c, 3);
  holder = std::move(other);  // assigning over a held slot releases it first
  EXPECT_EQ(c.in_flight.load(), 1);
  EXPECT_EQ(c.buffered.held.load(), 3);
  holder.release();
  EXPECT_EQ(c.in_flight.load(), 0);
  EXPECT_EQ(c.buffered.held.load(), 0);
}

TEST(AdmissionSlot, HandOverLeavesTheCountsToTheNewOwner) {
  ProxyCounters c;
  {
    AdmissionSlot slot = take(c, 9);
    slot.hand_over();
    EXPECT_FALSE(slot.held());
  }
  EXPECT_EQ(c.in_flight.load(), 1);  // the session gives them back when it ends
  EXPECT_EQ(c.buffered.held.load(), 9);
}

}  // namespace
}  // namespace pdr::router::proxy
