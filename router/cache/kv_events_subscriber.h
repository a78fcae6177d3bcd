// KvEventsSubscriber: the thread that subscribes to every node's vLLM KV cache events publisher
// and feeds a BlockIndex (block_index.h). Wire facts: shared/API_FACTS.md section 2.
//
// Which nodes: it follows the registry (the SnapshotCell the discovery thread publishes), looking
// for a new snapshot every `registry_poll`. A node that is not expired and has a
// kv_events_endpoint (or, failing that, `default_port` on its HTTP host) gets one ZMQ SUB socket
// per DP rank, rank r connected to port + r (vLLM offsets each rank's publisher so) or to the
// rank's own port when the node listed them (NodeSpec::kv_events_ports), subscribed to the
// `topic` prefix. On a new snapshot:
//   - node gone or expired: its sockets closed, BlockIndex::drop_node;
//   - node restarted (a new epoch: Instance::restarts moved, or its epoch changed): entries dropped,
//     sequence tracking restarted, sockets kept;
//   - endpoint, replay endpoint or dp_size changed: entries dropped, sockets reopened.
//
// Messages: exactly three frames [topic, seq (8 bytes big-endian), payload]; anything else is
// counted (bad_messages) and ignored. Sequence per (node, rank):
//   - the first message after (re)subscribing is accepted as it comes;
//   - seq == last + 1: applied;
//   - seq <= last: the publisher restarted (its counter starts at 0): the rank's entries dropped,
//     accepted;
//   - seq > last + 1, a gap (the SUB socket's high-water mark dropped messages, or the publisher
//     was unreachable): with a replay endpoint, a DEALER asks it for the batches from last + 1
//     (["", start_seq]) and applies those before seq as they come back, until the end marker or
//     `replay_timeout`; replayed batches at or after seq are ignored (the SUB socket delivers
//     them). An incomplete or failed replay, or no replay endpoint, drops the rank's entries
//     (counted in gaps; replays counts the replays that filled a gap), then seq is accepted.
//   - a payload that does not decode: counted (decode_errors), the rank's entries dropped (the
//     index must not miss a removal), seq accepted as the new position.
// Each DP rank is its own publisher and sequence, so only the rank that lost track is dropped; a
// node that restarted, expired or left drops every rank.
// A replay runs in this thread's poll loop beside everything else: while it is in flight (at most
// replay_timeout) only that rank's SUB socket waits (bounded by rcvhwm), holding the batch that
// revealed the gap; every other rank and node is served as usual.
//
// Bounds: every socket has ZMQ_MAXMSGSIZE = limits.max_payload_bytes + 4 KiB (libzmq drops the
// peer's connection beyond it) and ZMQ_RCVHWM = rcvhwm; a wake reads at most 1024 messages per
// socket so one busy publisher cannot starve the others or the registry check.
//
// Threading: start()/stop()/node_stats()/totals() from any thread. Sockets and sequence state
// live on the subscriber's own thread; counters are kept under a mutex the accessors take.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/snapshot_cell.h"
#include "base/status.h"
#include "discovery/instance.h"
#include "proto/kv_events.h"
#include "router/cache/block_index.h"

namespace pdr::router::cache {

struct KvEventsSubscriberOptions {
  std::string topic;                      // subscription prefix ("" = every message)
  std::optional<uint16_t> default_port;   // for nodes without kv_events_endpoint; unset = skip them
  proto::KvEventLimits limits;
  int rcvhwm = 100000;                    // per socket, messages (vLLM's publisher default hwm)
  std::chrono::milliseconds replay_timeout{2000};
  std::chrono::milliseconds registry_poll{100};
  uint32_t max_messages_per_wake = 1024;  // per socket
};

// Counters of one node (or, from totals(), of every node ever subscribed to: monotonic).
struct KvEventsNodeStats {
  std::string node;             // the registry key (HTTP address); "" in totals()
  std::string endpoint;         // rank 0's publisher, tcp://host:port
  std::string replay_endpoint;  // rank 0's replay socket, "" without one
  uint32_t subscribed_ranks = 0;  // SUB sockets open (totals: over every node)
  uint32_t ranks_seen = 0;        // ranks that delivered at least one message since subscribing
  uint64_t batches = 0;           // applied (live and replayed)
  uint64_t events = 0;            // known events in applied batches
  uint64_t gaps = 0;              // gaps that dropped entries (no replay, or replay failed)
  uint64_t replays = 0;           // gaps filled by a replay
  uint64_t replay_failures = 0;   // replays that timed out, broke off or did not cover the gap
  uint64_t decode_errors = 0;     // payloads that did not decode
  uint64_t bad_messages = 0;      // not [topic, 8-byte seq, payload]
  uint64_t publisher_restarts = 0;  // seq went backwards
  uint64_t node_restarts = 0;       // new epoch in the registry
  uint64_t blocks_indexed = 0;      // BlockIndex entries held now for the node (totals: all)
};

class KvEventsSubscriber {
 public:
  // Both must outlive the subscriber.
  KvEventsSubscriber(const SnapshotCell<discovery::RegistrySnapshot>& registry,
                     BlockIndex& index);
  ~KvEventsSubscriber();  // stop()
  KvEventsSubscriber(const KvEventsSubscriber&) = delete;
  KvEventsSubscriber& operator=(const KvEventsSubscriber&) = delete;

  // Starts the thread (which reads the current snapshot at once). Fails only when the thread's
  // ZMQ context or wake-up descriptor cannot be made. Call once.
  Status start(const KvEventsSubscriberOptions& options);
  // Stops and joins the thread; closes every socket. Idempotent.
  void stop();

  // Nodes subscribed to now, by key.
  std::vector<KvEventsNodeStats> node_stats() const;
  KvEventsNodeStats totals() const;
  const BlockIndex& index() const { return index_; }

 private:
  class Impl;
  BlockIndex& index_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdr::router::cache
