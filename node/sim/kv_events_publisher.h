// SimKvEventsPublisher: vLLM's ZMQ KV events publisher (`--kv-events-config`, publisher "zmq";
// docs/design/kv-events.md, Publisher) for `pdnode sim`, one per DP rank, on a thread of its own.
//
// Sockets: rank r binds a PUB on tcp://HOST:PORT+r as vLLM's do (PORT 0: each rank an ephemeral
// port of its own, which the registration lists, proto::NodeSpec::kv_events_ports) and, with a
// replay port, a ROUTER on tcp://HOST:REPLAY+r (REPLAY 0: the same). Each
// message is three frames [topic, seq (8 bytes big-endian, from 0 per rank), payload]. The
// ROUTER answers a request [id, "", start_seq (8 bytes)] with one message per buffered batch with
// seq >= start_seq, then an end marker, in the layout `replay_with_topic` picks
// (proto/kv_events_replay.h): [id, "", topic, seq, payload] ... [id, "", "", 0xFF x 8, ""] as
// vLLM >= 0.26 sends them, or [id, "", seq, payload] ... [id, "", 0xFF x 8, ""] as older vLLM
// and SGLang do. The buffer keeps each rank's last `buffer_steps` batches (vLLM's buffer_steps),
// within `buffer_bytes`. Requests of another shape are counted and ignored.
//
// publish() never blocks the caller: it queues the payload (bounded by max_queue and
// max_queue_bytes; beyond them the batch is dropped and counted) and wakes the thread, which numbers it, buffers it for replay and
// sends it without waiting (a send the socket refuses is dropped and counted; it stays in the
// replay buffer, so a subscriber sees a gap it can replay). A dropped-before-numbering batch
// leaves no gap: subscribers then miss its events silently, as with vLLM's own queue.
//
// withhold(n) (tests only): the next n batches are numbered and buffered but not sent, which is
// how a subscriber sees a gap to replay.
//
// Threads: start()/stop() from one owning thread; publish(), withhold(), stats() from any.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/base/status.h"

namespace pdr::node::sim {

struct SimKvEventsPublisherOptions {
  std::string host = "127.0.0.1";  // what to bind: an address, or "*" for every interface
  uint16_t port = 0;               // rank 0's PUB port, rank r's is port + r (0: each ephemeral)
  std::optional<uint16_t> replay_port;  // the same for the ROUTERs; none: no replay
  uint32_t ranks = 1;
  std::string topic;               // vLLM's default: empty
  bool replay_with_topic = true;   // the replay answers' layout (above)
  size_t buffer_steps = 10000;     // batches kept per rank for replay
  size_t buffer_bytes = 64 << 20;  // and at most these payload bytes per rank
  size_t max_queue = 100000;       // batches waiting for the thread
  size_t max_queue_bytes = 64 << 20;
  int sndhwm = 100000;             // vLLM's hwm default
};

class SimKvEventsPublisher {
 public:
  SimKvEventsPublisher();
  ~SimKvEventsPublisher();  // stop()
  SimKvEventsPublisher(const SimKvEventsPublisher&) = delete;
  SimKvEventsPublisher& operator=(const SimKvEventsPublisher&) = delete;

  // Binds every socket and starts the thread. kIoError when a bind fails.
  Status start(const SimKvEventsPublisherOptions& options);
  void stop();  // idempotent

  // Each rank's bound PUB port, and ROUTER port (empty without replay), once started.
  const std::vector<uint16_t>& ports() const;
  const std::vector<uint16_t>& replay_ports() const;

  // `rank` < options.ranks (others are dropped and counted).
  void publish(uint32_t rank, std::string payload);
  void withhold(uint32_t batches);
  // {"published":N,"dropped":N,"withheld":N,"replay_requests":N,"replayed_batches":N,
  //  "bad_replay_requests":N,"next_seq":[per rank],"ports":[per rank],"replay_ports":[per rank]}
  nlohmann::json stats() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdr::node::sim
