// Passive health of the nodes, learned from the legs themselves (outlier ejection).
//
// A node that cannot be connected to (refused, unreachable, a name that does not resolve, connect
// timeout) `after` legs in a row is ejected for `duration` (topology retries.eject_after_connect_
// failures and retries.eject_ms, defaults 3 and 5 s): pairing skips it while
// another candidate of its role remains, so requests stop paying a failed connect (up to the
// connect timeout) and a retry each. Static and admin instances have no heartbeat to expire them,
// and a registered node may advertise an address pdrouter cannot reach; this covers both.
// When the time is up the next request tries the node again: one more failed connect ejects it
// again at once, any answer (whatever its status) clears the count. Node answers such as 5xx are
// not counted: they may be the request's fault, and the node is reachable. A registered node
// that reports a restart (a new epoch) starts clean (discovery/registry.cc).
//
// State lives in the instance's InstanceLiveness, shared by every worker and every snapshot
// holding that instance; all functions here are thread-safe (relaxed atomics: a racing worker may
// eject a node one failure late or twice, which costs nothing).
#pragma once

#include <chrono>
#include <cstdint>

#include "discovery/instance.h"

namespace pdr::router::routing {

struct EjectionRule {
  uint32_t after = 3;  // connect failures in a row; 0: never eject
  std::chrono::milliseconds duration{5000};
};

// Counts a leg that could not connect. True when this failure ejected the node (log and count it).
bool note_connect_failure(discovery::InstanceLiveness& node, discovery::Clock::time_point now,
                          const EjectionRule& rule);
// A leg got an answer from the node: its failure count starts again from zero.
void note_answer(discovery::InstanceLiveness& node);
bool ejected(const discovery::InstanceLiveness& node, discovery::Clock::time_point now);
// How long the node stays ejected from `now` (zero when it is not).
std::chrono::milliseconds ejected_for(const discovery::InstanceLiveness& node,
                                      discovery::Clock::time_point now);

}  // namespace pdr::router::routing
