#include "router/cache/prefix_tree.h"

#include <algorithm>
#include <unordered_map>
#include <utility>

namespace pdr::router::cache {

struct PrefixTree::Node {
  std::string edge;  // bytes from the parent to here (empty only at the root)
  Node* parent = nullptr;
  std::map<char, std::unique_ptr<Node>> children;
  std::vector<std::pair<uint32_t, Clock::time_point>> tenants;  // who routed through here, when last

  void mark(uint32_t tenant, Clock::time_point now) {
    for (auto& [id, at] : tenants) {
      if (id == tenant) {
        at = std::max(at, now);
        return;
      }
    }
    tenants.emplace_back(tenant, now);
  }
  Clock::time_point last_used() const {
    Clock::time_point latest{};
    for (const auto& [id, at] : tenants) latest = std::max(latest, at);
    return latest;
  }
};

namespace {

size_t common_prefix(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

PrefixTree::PrefixTree(size_t max_bytes, size_t max_prompt_bytes)
    : max_bytes_(max_bytes), max_prompt_bytes_(max_prompt_bytes), root_(std::make_unique<Node>()) {}

PrefixTree::~PrefixTree() {
  // Iteratively: a chain of prompts one byte apart makes the tree as deep as max_prompt_bytes,
  // too deep for recursive destruction on a worker's stack.
  std::vector<std::unique_ptr<Node>> pending;
  pending.push_back(std::move(root_));
  while (!pending.empty()) {
    std::unique_ptr<Node> n = std::move(pending.back());
    pending.pop_back();
    for (auto& [c, child] : n->children) pending.push_back(std::move(child));
  }
}

uint32_t PrefixTree::tenant_id(std::string_view tenant) {
  if (auto it = tenant_ids_.find(tenant); it != tenant_ids_.end()) return it->second;
  const auto id = static_cast<uint32_t>(tenants_.size());
  tenants_.emplace_back(tenant);
  tenant_ids_.emplace(std::string(tenant), id);
  return id;
}

void PrefixTree::insert(std::string_view prompt, std::string_view tenant, Clock::time_point now) {
  const std::string_view p = prompt.substr(0, std::min(prompt.size(), max_prompt_bytes_));
  if (p.empty()) return;
  std::lock_guard lock(mu_);
  const uint32_t id = tenant_id(tenant);
  Node* node = root_.get();
  size_t pos = 0;
  while (pos < p.size()) {
    auto it = node->children.find(p[pos]);
    if (it == node->children.end()) {
      auto leaf = std::make_unique<Node>();
      leaf->edge = std::string(p.substr(pos));
      leaf->parent = node;
      leaf->mark(id, now);
      bytes_ += leaf->edge.size();
      ++tree_nodes_;
      node->children.emplace(p[pos], std::move(leaf));
      break;
    }
    Node* child = it->second.get();
    const size_t common = common_prefix(child->edge, p.substr(pos));
    if (common < child->edge.size()) {
      // Split the edge: `mid` takes its first `common` bytes; whoever passed through the child
      // passed through mid too.
      auto mid = std::make_unique<Node>();
      mid->edge = child->edge.substr(0, common);
      mid->parent = node;
      mid->tenants = child->tenants;
      std::unique_ptr<Node> moved = std::move(it->second);
      moved->edge.erase(0, common);
      moved->parent = mid.get();
      mid->children.emplace(moved->edge[0], std::move(moved));
      child = mid.get();
      it->second = std::move(mid);
      ++tree_nodes_;
    }
    child->mark(id, now);
    node = child;
    pos += common;
  }
  if (bytes_ > max_bytes_) evict_locked();
}

std::vector<PrefixTree::Match> PrefixTree::match(std::string_view prompt) const {
  const std::string_view p = prompt.substr(0, std::min(prompt.size(), max_prompt_bytes_));
  std::lock_guard lock(mu_);
  std::unordered_map<uint32_t, size_t> best;
  const Node* node = root_.get();
  size_t pos = 0;
  while (pos < p.size()) {
    auto it = node->children.find(p[pos]);
    if (it == node->children.end()) break;
    const Node* child = it->second.get();
    const size_t common = common_prefix(child->edge, p.substr(pos));
    // Deeper nodes come later: a tenant's entry ends at the deepest node it marked.
    for (const auto& [id, at] : child->tenants) best[id] = pos + common;
    if (common < child->edge.size()) break;
    node = child;
    pos += common;
  }
  std::vector<Match> out;
  out.reserve(best.size());
  for (const auto& [id, bytes] : best) out.push_back({tenants_[id], bytes});
  std::sort(out.begin(), out.end(), [](const Match& a, const Match& b) {
    return a.matched_bytes != b.matched_bytes ? a.matched_bytes > b.matched_bytes : a.tenant < b.tenant;
  });
  return out;
}

void PrefixTree::evict_locked() {
  const size_t target = max_bytes_ / 10 * 9;
  while (bytes_ > target) {
    // Leaves, least recently used first; dropping one may make its parent a leaf for the next
    // round.
    std::vector<Node*> leaves;
    std::vector<Node*> stack{root_.get()};
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      if (n != root_.get() && n->children.empty()) leaves.push_back(n);
      for (auto& [c, child] : n->children) stack.push_back(child.get());
    }
    if (leaves.empty()) return;
    std::sort(leaves.begin(), leaves.end(), [](const Node* a, const Node* b) { return a->last_used() < b->last_used(); });
    for (Node* leaf : leaves) {
      if (bytes_ <= target) break;
      evictions_ += leaf->tenants.size();
      bytes_ -= leaf->edge.size();
      --tree_nodes_;
      Node* parent = leaf->parent;
      parent->children.erase(leaf->edge[0]);
    }
  }
}

void PrefixTree::remove_tenant(std::string_view tenant) {
  std::lock_guard lock(mu_);
  auto found = tenant_ids_.find(tenant);
  if (found == tenant_ids_.end()) return;
  const uint32_t id = found->second;
  drop_tenant_from(root_.get(), id);
}

// Drops the tenant's marks everywhere, then removes the leaves left without a tenant, bottom up
// (iteratively: see the destructor).
void PrefixTree::drop_tenant_from(Node* top, uint32_t tenant) {
  std::vector<Node*> order;  // pre-order; walked backwards it visits children before parents
  std::vector<Node*> stack{top};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    order.push_back(n);
    for (auto& [c, child] : n->children) stack.push_back(child.get());
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* n = *it;
    std::erase_if(n->tenants, [&](const auto& t) { return t.first == tenant; });
    if (n != top && n->tenants.empty() && n->children.empty()) {
      bytes_ -= n->edge.size();
      --tree_nodes_;
      n->parent->children.erase(n->edge[0]);
    }
  }
}

PrefixTree::Stats PrefixTree::stats() const {
  std::lock_guard lock(mu_);
  return Stats{bytes_, tree_nodes_, evictions_};
}

}  // namespace pdr::router::cache
