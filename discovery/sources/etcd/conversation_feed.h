// ConversationFeed: what the registry replicator (registry_replicator.h) needs from whoever
// shares multi-turn entries through etcd under <prefix>conversations/ (key and value:
// proto/etcd_conversation.h). The router's ConversationMirror (router/conversation_mirror.h)
// implements it over its conversation cache; the replicator only moves operations and answers
// between it and etcd, on its own thread, and never sees the cache.
//
// Threading: every call below comes from the replicator's thread. The feed wakes that thread
// (the `wake` function the replicator gives it, RegistryReplicator::mirror_conversations) from
// any thread after it queued an operation.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "proto/etcd_json.h"

namespace pdr::discovery::sources::etcd {

// One etcd operation for a conversation key.
struct ConversationOp {
  std::string key;
  bool is_delete = false;
  std::string value;      // put only
  int64_t lease_seconds = 0;  // put only: the lease must last at least this long
};

class ConversationFeed {
 public:
  using WallClock = std::chrono::system_clock;
  using Clock = std::chrono::steady_clock;

  virtual ~ConversationFeed() = default;

  // No more wakes (the replicator's thread is stopping): later operations are dropped.
  virtual void close() = 0;
  // Up to `max` queued operations, oldest first.
  virtual std::vector<ConversationOp> pop(size_t max) = 0;
  // Drops every queued operation, counting each as a failure (etcd unreachable); returns how many.
  virtual size_t drop_queued() = 0;

  // A full range of the prefix, and watch events after it. `now_wall` / `now` are the two
  // clocks at this moment.
  virtual void resync(const std::vector<proto::EtcdKeyValue>& kvs, WallClock::time_point now_wall,
                      Clock::time_point now) = 0;
  virtual void apply(const std::vector<proto::EtcdEvent>& events, WallClock::time_point now_wall,
                     Clock::time_point now) = 0;

  // The replicator's own operations on a key: a put sent, its answer (etcd's revision when
  // `ok`), a delete sent.
  virtual void put_sent(const std::string& key) = 0;
  virtual void put_answered(const std::string& key, bool ok, int64_t revision) = 0;
  virtual void delete_sent(const std::string& key) = 0;
};

}  // namespace pdr::discovery::sources::etcd
