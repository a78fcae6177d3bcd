#include "router/routing/mooncake_cache.h"

#include <utility>

namespace pdr::router::routing {

void MooncakeEngineCache::get(const discovery::Instance& prefill, uint16_t bootstrap_port,
                              http::UpstreamTimeouts timeouts, Done done) {
  const auto now = std::chrono::steady_clock::now();
  Entry& entry = entries_[prefill.key];
  if (entry.epoch != prefill.epoch) {  // the node restarted: what we knew is stale
    if (entry.fetch) entry.fetch->cancel();
    std::vector<Done> waiters = std::move(entry.waiters);
    entry = Entry{};
    entry.epoch = prefill.epoch;
    for (auto& w : waiters) w(Status(StatusCode::kIoError, "prefill restarted during the bootstrap query"), nullptr);
  }
  if (entry.engines && now - entry.fetched_at < kTtl) {
    auto engines = entry.engines;  // keep alive across the callback
    done(Status::ok(), engines.get());
    return;
  }
  entry.waiters.push_back(std::move(done));
  if (entry.fetch) return;

  http::UpstreamRequest request;
  request.method = "GET";
  request.path = "/query";
  proto::HostPort target{prefill.http_address.host, bootstrap_port};
  auto body = std::make_shared<std::string>();
  auto status = std::make_shared<int>(0);
  const std::string key = prefill.key;
  const uint64_t epoch = prefill.epoch;
  http::UpstreamCallbacks cb;
  cb.on_head = [status](int s, const std::vector<http::Header>&) { *status = s; };
  cb.on_body = [this, body, key, epoch](std::string_view chunk) {
    if (body->size() + chunk.size() > kMaxAnswerBytes) {
      finish(key, epoch, Status(StatusCode::kTooLarge, "bootstrap /query answer too large"), nullptr);
      return;
    }
    body->append(chunk);
  };
  cb.on_complete = [this, body, status, key, epoch, target] {
    if (*status != 200) {
      finish(key, epoch,
             Status(StatusCode::kIoError, "bootstrap server http://" + target.to_string() + "/query answered " +
                                              std::to_string(*status)),
             nullptr);
      return;
    }
    auto engines = std::make_shared<proto::MooncakeEngines>();
    Status st = proto::parse_mooncake_query(*body, engines.get());
    finish(key, epoch, st, st.is_ok() ? engines : nullptr);
  };
  cb.on_error = [this, key, epoch, target](const Status& error) {
    finish(key, epoch,
           Status(error.code(), "bootstrap server http://" + target.to_string() + "/query: " + error.message()),
           nullptr);
  };
  entry.fetch = upstream_.start(target, std::move(request), timeouts, std::move(cb));
}

void MooncakeEngineCache::finish(const std::string& key, uint64_t epoch, const Status& status,
                                 std::shared_ptr<proto::MooncakeEngines> engines) {
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.epoch != epoch) return;
  Entry& entry = it->second;
  if (entry.fetch) {
    auto fetch = std::move(entry.fetch);
    fetch->cancel();  // no-op when it completed; stops an oversized answer
  }
  if (engines) {
    entry.engines = engines;
    entry.fetched_at = std::chrono::steady_clock::now();
  }
  std::vector<Done> waiters = std::move(entry.waiters);
  entry.waiters.clear();
  for (auto& w : waiters) w(status, engines.get());
}

void MooncakeEngineCache::invalidate(const std::string& instance_key) {
  auto it = entries_.find(instance_key);
  if (it != entries_.end() && !it->second.fetch) it->second.engines.reset();
}

}  // namespace pdr::router::routing
