// FaultyBackend: wraps any backend and injects latency, failures and corruption, so the callers of
// the engine (the simulated nodes, the router's tests) can be tested against a misbehaving
// transport without a misbehaving network. A test double: it lives in the test-support library
// pdr_transfer_test_support (tests/CMakeLists.txt), never in a product library; tests wrap a
// backend themselves or build a whole list with make_test_backends() (test_backends.h).
//
//   faults.latency        every transfer starts this much later (on the wrapper's timer thread)
//   faults.fail_every     every N-th transfer fails with `fail_cause` without reaching the inner
//                         backend (0: never)
//   faults.corrupt_every  every N-th transfer that succeeds lands one flipped byte: a READ has it
//                         flipped in the local destination after landing; a WRITE flips it in the
//                         local source before sending and restores it after (0: never)
//
// Counting is per wrapper and deterministic (no randomness), so tests know which transfer is hit.
// Everything else (start, peers, regions, notifications) passes straight through.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>

#include "transfer/backend.h"

namespace pdr::transfer {

struct FaultPlan {
  std::chrono::microseconds latency{0};
  std::uint32_t fail_every = 0;
  XferCause fail_cause = XferCause::kPeerGone;
  std::uint32_t corrupt_every = 0;
};

// Parses "latency_us=500,fail_every=10,fail_cause=peer_gone,corrupt_every=7" (any subset, in any
// order; "" is no faults). kInvalidValue names the bad item.
Status parse_fault_plan(std::string_view text, FaultPlan* out);

std::unique_ptr<Backend> make_faulty_backend(std::unique_ptr<Backend> inner, const FaultPlan& plan);

}  // namespace pdr::transfer
