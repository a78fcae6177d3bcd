// Per-worker cache of Mooncake prefill engine ids: the bootstrap server's GET /query answer
// (DP rank -> engine_id, docs/design/wire-formats.md section 4), fetched on first use per prefill
// instance and kept for kTtl, or until invalidated (a failed leg on that prefill, or the prefill
// restarted: the cache key includes its epoch).
//
// Worker thread only. get() answers synchronously from the cache, else starts one fetch per
// instance and queues the callers until it ends; callbacks run on the worker thread.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "discovery/instance.h"
#include "proto/mooncake_query.h"
#include "proto/base/status.h"
#include "router/http/upstream_client.h"
#include "router/routing/node_calls.h"

namespace pdr::router::routing {

class MooncakeEngineCache {
 public:
  static constexpr std::chrono::seconds kTtl{30};
  static constexpr size_t kMaxAnswerBytes = 1024 * 1024;
  using Done = std::function<void(const Status& status, const proto::MooncakeEngines* engines)>;

  explicit MooncakeEngineCache(NodeCalls& upstream) : upstream_(upstream) {}

  // `bootstrap_port`: the instance's own, else the topology's connectors.mooncake_bootstrap_port.
  void get(const discovery::Instance& prefill, uint16_t bootstrap_port, http::UpstreamTimeouts timeouts,
           Done done);
  void invalidate(const std::string& instance_key);

 private:
  struct Entry {
    uint64_t epoch = 0;
    std::chrono::steady_clock::time_point fetched_at{};
    std::shared_ptr<proto::MooncakeEngines> engines;  // null until a fetch succeeded
    NodeCalls::CallPtr fetch;  // in flight
    std::vector<Done> waiters;
  };
  void finish(const std::string& key, uint64_t epoch, const Status& status,
              std::shared_ptr<proto::MooncakeEngines> engines);

  NodeCalls& upstream_;
  std::map<std::string, Entry, std::less<>> entries_;
};

}  // namespace pdr::router::routing
