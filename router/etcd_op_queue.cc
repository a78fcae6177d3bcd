// A mirror's bounded queue of etcd operations (contracts in etcd_op_queue.h).
#include "router/etcd_op_queue.h"

#include <utility>

namespace pdr::router {

bool EtcdOpQueue::push(Op op) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return true;
  if (queue_.size() >= kMaxQueued) return false;  // etcd is far behind: this one is not shared
  queue_.push_back(std::move(op));
  wake_();
  return true;
}

void EtcdOpQueue::close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
}

std::vector<EtcdOpQueue::Op> EtcdOpQueue::pop(size_t max) {
  std::vector<Op> out;
  std::lock_guard<std::mutex> lock(mu_);
  while (out.size() < max && !queue_.empty()) {
    out.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  return out;
}

size_t EtcdOpQueue::drop_all() {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t n = queue_.size();
  queue_.clear();
  return n;
}

}  // namespace pdr::router
