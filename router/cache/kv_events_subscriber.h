// KvEventsSubscriber: the thread that subscribes to every node's vLLM KV cache events publisher
// and feeds a BlockIndex (block_index.h). Wire facts: docs/design/kv-events.md.
//
// Which nodes: it follows the registry (the SnapshotCell the discovery thread publishes), taking
// each new snapshot within `registry_poll` (at once when it sees the cell's version move between
// two messages). A node that is not expired and has a
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
//   - the first message after (re)subscribing, or after batches were discarded over the node's
//     allowance (below), is accepted as it comes;
//   - seq == last + 1: applied;
//   - seq <= last: the publisher restarted (its counter starts at 0): the rank's entries dropped,
//     accepted;
//   - seq > last + 1, a gap (the publisher's high-water mark dropped messages, or it was
//     unreachable): with a replay endpoint, a DEALER asks it for the batches from last + 1
//     (["", start_seq]) and applies those before seq as they come back, in either answer layout
//     (with the topic frame, vLLM >= 0.26, or without: proto/kv_events_replay.h), until the end
//     marker or `replay_timeout`; replayed batches at or after seq are ignored (the SUB socket
//     delivers them). An incomplete or failed replay, or no replay endpoint, drops the rank's
//     entries (counted in gaps; replays counts the replays that filled a gap), then seq is accepted.
//   - a payload that does not decode: counted (decode_errors), the rank's entries dropped (the
//     index must not miss a removal), seq accepted as the new position.
// Each DP rank is its own publisher and sequence, so only the rank that lost track is dropped; a
// node that restarted, expired or left drops every rank.
// A replay runs in this thread's poll loop beside everything else: while it is in flight (at most
// replay_timeout) only that rank's SUB socket waits (bounded by rcvhwm), holding the batch that
// revealed the gap; every other rank and node is served as usual.
//
// Bounds (a node's publisher is untrusted input):
//   - Bytes: libzmq bounds a socket's queue in messages, not bytes, so every SUB and replay socket
//     has a small ZMQ_RCVHWM (`rcvhwm` messages; a publisher not read meanwhile is held back by
//     TCP and queues or drops on its own side) and ZMQ_MAXMSGSIZE = max_batch_bytes() + 4 KiB
//     (libzmq drops the peer's connection beyond it; a lost batch then shows as a gap). One rank
//     thus holds at most about (rcvhwm + 1) x max_batch_bytes() queued in this process.
//   - Allowance per node (kv_events_rate_limit.h): every message a node sends (live or replayed,
//     over all its ranks) is charged against `max_node_batches_per_sec` and
//     `max_node_bytes_per_sec` before it is decoded. A message over the allowance is discarded
//     (counted in rate_limited); the first discarded on a rank drops that rank's entries and counts
//     a gap, as a lost sequence does, and the next message that fits starts it again. A batch
//     larger than a whole second of the node's bytes could never fit, which is why
//     max_batch_bytes() is min(limits.max_payload_bytes, max_node_bytes_per_sec).
//   - Time: ready sockets are served round-robin, each for one turn of at most
//     `max_messages_per_turn` messages and `turn_budget` (a batch being applied is finished first),
//     and stop(), registry changes and the registry timer are checked between messages, so one
//     busy publisher can neither starve the other nodes nor hold up stop() beyond one batch.
//   - Sockets: at most `max_ranks_per_node` ranks of a node are subscribed (the rest counted in
//     ranks_over_cap), and at most max_subscriptions() SUB sockets in all: `max_subscriptions`,
//     or fewer when the process's open-file limit cannot hold them (subscription_budget() below);
//     the ZMQ context's ZMQ_MAX_SOCKETS is sized from it. A node that got fewer ranks than it
//     wants (the total cap, a socket error) is retried on every new registry snapshot and every
//     `resubscribe_interval`, so it is subscribed once sockets free up.
//   - Logs: gaps, restarts, replay timeouts, discarded batches and (un)subscriptions go through
//     a LogLimiter (proto/base/log_limiter.h): a flood of them costs a few lines a second.
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

#include "proto/base/snapshot_cell.h"
#include "proto/base/status.h"
#include "discovery/instance.h"
#include "proto/kv_events.h"
#include "router/cache/block_index.h"

namespace pdr::router::cache {

struct KvEventsSubscriberOptions {
  std::string topic;                      // subscription prefix ("" = every message)
  std::optional<uint16_t> default_port;   // for nodes without kv_events_endpoint; unset = skip them
  proto::KvEventLimits limits;
  int rcvhwm = 32;                        // per socket, messages (see Bounds above)
  std::chrono::milliseconds replay_timeout{2000};
  std::chrono::milliseconds registry_poll{100};
  // One turn of one ready socket (see Bounds above).
  uint32_t max_messages_per_turn = 256;
  std::chrono::microseconds turn_budget{10000};
  // Per node, over all its DP ranks, live and replayed (topology kv_events.*).
  uint32_t max_node_batches_per_sec = 10000;
  uint64_t max_node_bytes_per_sec = 8u << 20;
  uint32_t max_ranks_per_node = 64;
  uint32_t max_subscriptions = 1024;      // SUB sockets in all, before the open-file limit's cap
  std::chrono::milliseconds resubscribe_interval{1000};
};

// The subscriber's share of an open-file limit of `fd_limit` (RLIMIT_NOFILE's soft limit; 0 or
// RLIM_INFINITY: no cap): a quarter of the descriptors, at four per subscription (its connection
// and its socket's mailbox, and as many again for a replay in flight), and at most `configured`.
// At least 1.
uint32_t subscription_budget(uint64_t fd_limit, uint32_t configured);

// Counters of one node (or, from totals(), of every node ever subscribed to: monotonic).
struct KvEventsNodeStats {
  std::string node;             // the registry key (HTTP address); "" in totals()
  std::string endpoint;         // rank 0's publisher, tcp://host:port
  std::string replay_endpoint;  // rank 0's replay socket, "" without one
  uint32_t wanted_ranks = 0;      // the registry's dp_size (totals: over every node)
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
  uint64_t rate_limited = 0;        // messages discarded over the node's allowance
  uint64_t ranks_over_cap = 0;      // ranks beyond max_ranks_per_node, counted at each subscription
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
  // Stops and joins the thread; closes every socket. Returns once the batch being applied, if
  // any, is done: the thread checks for stop between messages. Idempotent.
  void stop();

  // Valid after start(): SUB sockets allowed in all (subscription_budget), the largest batch
  // a socket accepts.
  uint32_t max_subscriptions() const;
  size_t max_batch_bytes() const;

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
