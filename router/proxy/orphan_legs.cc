// Orphaned prefill legs per node (contract in orphan_legs.h).
#include "router/proxy/orphan_legs.h"

#include <algorithm>

namespace pdr::router::proxy {

size_t OrphanLegs::per_worker_limit(uint32_t limit, uint32_t workers) {
  if (limit == 0) return 0;
  const uint32_t n = std::max<uint32_t>(1, workers);
  return (static_cast<size_t>(limit) + n - 1) / n;
}

uint64_t OrphanLegs::add(const std::string& node, std::weak_ptr<ProxySession> session, size_t limit,
                         std::weak_ptr<ProxySession>* evict) {
  auto& list = by_node_[node];
  const uint64_t id = next_id_++;
  list.push_back({id, std::move(session)});
  ++size_;
  if (limit > 0 && list.size() > limit) {
    *evict = std::move(list.front().session);
    list.pop_front();
    --size_;
  }
  return id;
}

void OrphanLegs::remove(const std::string& node, uint64_t id) {
  auto it = by_node_.find(node);
  if (it == by_node_.end()) return;
  auto& list = it->second;
  // Orphans mostly end in the order they began (same grace): the front is the usual match.
  auto entry = std::find_if(list.begin(), list.end(), [id](const Entry& e) { return e.id == id; });
  if (entry == list.end()) return;
  list.erase(entry);
  --size_;
  if (list.empty()) by_node_.erase(it);
}

}  // namespace pdr::router::proxy
