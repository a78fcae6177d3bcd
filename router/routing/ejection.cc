#include "router/routing/ejection.h"

namespace pdr::router::routing {

using discovery::Clock;

namespace {
int64_t ns_of(Clock::time_point t) { return t.time_since_epoch().count(); }
}  // namespace

bool note_connect_failure(discovery::InstanceLiveness& node, Clock::time_point now, const EjectionRule& rule) {
  const uint32_t failures = node.connect_failures.fetch_add(1, std::memory_order_relaxed) + 1;
  if (rule.after == 0 || failures < rule.after || ejected(node, now)) return false;
  node.ejected_until_ns.store(ns_of(now + rule.duration), std::memory_order_relaxed);
  return true;
}

void note_answer(discovery::InstanceLiveness& node) {
  // Most answers come from healthy nodes: read first so they do not write a shared cache line.
  if (node.connect_failures.load(std::memory_order_relaxed) != 0) {
    node.connect_failures.store(0, std::memory_order_relaxed);
  }
}

bool ejected(const discovery::InstanceLiveness& node, Clock::time_point now) {
  return node.ejected_until_ns.load(std::memory_order_relaxed) > ns_of(now);
}

std::chrono::milliseconds ejected_for(const discovery::InstanceLiveness& node, Clock::time_point now) {
  const int64_t left = node.ejected_until_ns.load(std::memory_order_relaxed) - ns_of(now);
  if (left <= 0) return std::chrono::milliseconds(0);
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::nanoseconds(left)) +
         std::chrono::milliseconds(1);  // never shows 0 while still ejected
}

}  // namespace pdr::router::routing
