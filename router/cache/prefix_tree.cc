#include "router/cache/prefix_tree.h"

#include <algorithm>
#include <cassert>
#include <utility>

namespace pdr::router::cache {

struct PrefixTree::Mark {
  uint32_t tenant;
  Clock::time_point at;  // last routed through here
};

struct PrefixTree::Node {
  std::string edge;  // bytes from the parent to here (empty only at the root)
  Node* parent = nullptr;
  Node* older = nullptr;  // neighbours in the least-recently-used list
  Node* newer = nullptr;
  std::vector<std::unique_ptr<Node>> children;  // ordered by the first byte of their edge
  std::vector<Mark> marks;                      // one per tenant that routed through here
  uint32_t charged = 0;                         // what this node adds to bytes_
};

namespace {

// Each sweep step of an insert beyond the nodes its own path moved (see sweep_locked).
constexpr size_t kSweepSteps = 16;

size_t common_prefix(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

unsigned char byte(char c) { return static_cast<unsigned char>(c); }

// True when the string's text is in its inline (small string) buffer, not on the heap.
bool inline_text(const std::string& s) {
  const auto* self = reinterpret_cast<const char*>(&s);
  return s.data() >= self && s.data() < self + sizeof(s);
}

// Where a child whose edge starts with `first` is or would go: the list is ordered by that byte.
template <typename Children>
auto child_slot(Children& children, char first) {
  return std::partition_point(children.begin(), children.end(),
                              [c = byte(first)](const auto& child) { return byte(child->edge[0]) < c; });
}

}  // namespace

PrefixTree::PrefixTree(size_t max_bytes, size_t max_prompt_bytes)
    : max_bytes_(max_bytes), max_prompt_bytes_(max_prompt_bytes), root_(std::make_unique<Node>()) {
  recharge(root_.get());
}

PrefixTree::~PrefixTree() {
  // Iteratively: a chain of prompts one byte apart makes the tree as deep as max_prompt_bytes,
  // too deep for recursive destruction on a worker's stack.
  std::vector<std::unique_ptr<Node>> pending;
  pending.push_back(std::move(root_));
  while (!pending.empty()) {
    std::unique_ptr<Node> n = std::move(pending.back());
    pending.pop_back();
    for (auto& child : n->children) pending.push_back(std::move(child));
  }
}

// The charge of one node: its allocation, its child list's and marks' buffers, its text when not
// inline. A child's slot is in its parent's list buffer, charged to the parent.
void PrefixTree::recharge(Node* n) {
  size_t cost = heap_cost(sizeof(Node));
  if (!inline_text(n->edge)) cost += heap_cost(n->edge.capacity() + 1);
  cost += heap_cost(n->children.capacity() * sizeof(std::unique_ptr<Node>));
  cost += heap_cost(n->marks.capacity() * sizeof(Mark));
  bytes_ = bytes_ - n->charged + cost;
  n->charged = static_cast<uint32_t>(cost);
}

uint32_t PrefixTree::tenant_id(std::string_view tenant) {
  if (auto it = tenant_ids_.find(tenant); it != tenant_ids_.end()) return it->second;
  uint32_t id;
  if (!free_tenants_.empty()) {
    id = free_tenants_.back();
    free_tenants_.pop_back();
  } else {
    id = static_cast<uint32_t>(tenants_.size());
    tenants_.emplace_back();
  }
  Tenant& slot = tenants_[id];
  slot.key.assign(tenant);
  slot.live = true;
  slot.marks = 0;
  // The slot, the table's entry (a tree node holding the key and the id) and both copies of the key.
  const size_t key_heap = inline_text(slot.key) ? 0 : heap_cost(slot.key.capacity() + 1);
  const size_t entry = heap_cost(4 * sizeof(void*) + sizeof(std::pair<const std::string, uint32_t>));
  slot.charged = static_cast<uint32_t>(sizeof(Tenant) + entry + 2 * key_heap);
  bytes_ += slot.charged;
  ++tenant_slots_;
  tenant_ids_.emplace(std::string(tenant), id);
  return id;
}

void PrefixTree::ref(uint32_t tenant) { ++tenants_[tenant].marks; }

void PrefixTree::unref(uint32_t tenant) {
  Tenant& slot = tenants_[tenant];
  if (--slot.marks > 0) return;
  // No mark names the slot any more: free it (a live key gets a new one on its next insert).
  if (slot.live) tenant_ids_.erase(slot.key);
  bytes_ -= slot.charged;
  slot = Tenant{};
  free_tenants_.push_back(tenant);
  --tenant_slots_;
}

void PrefixTree::mark(Node* node, uint32_t tenant, Clock::time_point now) {
  bool found = false;
  const size_t capacity = node->marks.capacity();
  for (size_t i = 0; i < node->marks.size();) {
    Mark& m = node->marks[i];
    if (m.tenant == tenant) {
      m.at = std::max(m.at, now);
      found = true;
      ++i;
    } else if (!tenants_[m.tenant].live) {  // a retired tenant's: dropped while we are here
      unref(m.tenant);
      m = node->marks.back();
      node->marks.pop_back();
    } else {
      ++i;
    }
  }
  if (!found) {
    node->marks.push_back({tenant, now});
    ref(tenant);
  }
  if (node->marks.capacity() != capacity) recharge(node);
}

void PrefixTree::drop_retired_marks(Node* node) {
  const size_t before = node->marks.size();
  std::erase_if(node->marks, [&](const Mark& m) {
    if (tenants_[m.tenant].live) return false;
    unref(m.tenant);
    return true;
  });
  if (node->marks.size() != before) {
    if (node->marks.empty()) node->marks.shrink_to_fit();
    recharge(node);
  }
}

void PrefixTree::link_after(Node* node, Node* older) {
  node->older = older;
  node->newer = older != nullptr ? older->newer : oldest_;
  (node->newer != nullptr ? node->newer->older : newest_) = node;
  (older != nullptr ? older->newer : oldest_) = node;
}

void PrefixTree::unlink(Node* node) {
  if (sweep_ == node) sweep_ = node->newer;
  (node->older != nullptr ? node->older->newer : oldest_) = node->newer;
  (node->newer != nullptr ? node->newer->older : newest_) = node->older;
  node->older = node->newer = nullptr;
}

void PrefixTree::move_to_newest(Node* node) {
  if (node == newest_) return;
  unlink(node);
  link_after(node, newest_);
}

void PrefixTree::insert(std::string_view prompt, std::string_view tenant, Clock::time_point now) {
  const std::string_view p = prompt.substr(0, std::min(prompt.size(), max_prompt_bytes_));
  if (p.empty()) return;
  std::lock_guard lock(mu_);
  const uint32_t id = tenant_id(tenant);
  Node* node = root_.get();
  size_t pos = 0;
  while (pos < p.size()) {
    auto it = child_slot(node->children, p[pos]);
    if (it == node->children.end() || (*it)->edge[0] != p[pos]) {
      auto leaf = std::make_unique<Node>();
      leaf->edge.assign(p.substr(pos));
      leaf->parent = node;
      Node* added = leaf.get();
      node->children.insert(it, std::move(leaf));
      recharge(node);
      link_after(added, newest_);
      ++tree_nodes_;
      mark(added, id, now);
      node = added;
      break;
    }
    Node* child = it->get();
    const size_t common = common_prefix(child->edge, p.substr(pos));
    if (common < child->edge.size()) {
      // Split the edge: `mid` takes its first `common` bytes; whoever passed through the child
      // passed through mid too.
      auto mid = std::make_unique<Node>();
      mid->edge.assign(child->edge, 0, common);
      mid->parent = node;
      mid->marks = child->marks;
      for (const Mark& m : mid->marks) ref(m.tenant);
      std::unique_ptr<Node> moved = std::move(*it);
      moved->edge = moved->edge.substr(common);  // a buffer sized to what is left
      moved->parent = mid.get();
      recharge(moved.get());
      mid->children.push_back(std::move(moved));
      Node* m = mid.get();
      *it = std::move(mid);
      link_after(m, child);  // newer than its child, as every parent is
      ++tree_nodes_;
      recharge(m);
      child = m;
    }
    mark(child, id, now);
    node = child;
    pos += common;
  }
  // The path was used now: to the newest end, deepest first, so each node stays after its
  // descendants and the oldest end stays a leaf.
  size_t path = 0;
  for (Node* n = node; n != root_.get(); n = n->parent, ++path) move_to_newest(n);
  if (sweep_ == nullptr && sweep_wanted_) {
    sweep_ = oldest_;
    sweep_wanted_ = false;
  }
  // At least as many steps as nodes this insert moved behind the sweep, so a pass always ends.
  if (sweep_ != nullptr) sweep_locked(path + kSweepSteps);
  if (bytes_ > max_bytes_) evict_locked();
}

std::vector<PrefixTree::Match> PrefixTree::match(std::string_view prompt) const {
  const std::string_view p = prompt.substr(0, std::min(prompt.size(), max_prompt_bytes_));
  std::lock_guard lock(mu_);
  std::vector<std::pair<uint32_t, size_t>> best;  // tenant, matched bytes
  const Node* node = root_.get();
  size_t pos = 0;
  while (pos < p.size()) {
    auto it = child_slot(node->children, p[pos]);
    if (it == node->children.end() || (*it)->edge[0] != p[pos]) break;
    const Node* child = it->get();
    const size_t common = common_prefix(child->edge, p.substr(pos));
    // Deeper nodes come later: a tenant's entry ends at the deepest node it marked.
    for (const Mark& m : child->marks) {
      if (!tenants_[m.tenant].live) continue;  // retired: its node's cache is gone
      auto found = std::find_if(best.begin(), best.end(), [&](const auto& b) { return b.first == m.tenant; });
      if (found != best.end()) {
        found->second = pos + common;
      } else {
        best.emplace_back(m.tenant, pos + common);
      }
    }
    if (common < child->edge.size()) break;
    node = child;
    pos += common;
  }
  std::vector<Match> out;
  out.reserve(best.size());
  for (const auto& [id, bytes] : best) out.push_back({tenants_[id].key, bytes});
  std::sort(out.begin(), out.end(), [](const Match& a, const Match& b) {
    return a.matched_bytes != b.matched_bytes ? a.matched_bytes > b.matched_bytes : a.tenant < b.tenant;
  });
  return out;
}

void PrefixTree::remove_leaf(Node* leaf, bool evicted) {
  Node* parent = leaf->parent;
  unlink(leaf);
  for (const Mark& m : leaf->marks) unref(m.tenant);
  if (evicted) {
    evictions_ += leaf->marks.size();
    ++evicted_nodes_;
  }
  bytes_ -= leaf->charged;
  --tree_nodes_;
  auto it = child_slot(parent->children, leaf->edge[0]);
  assert(it != parent->children.end() && it->get() == leaf);
  parent->children.erase(it);  // frees the leaf
  if (parent->children.size() <= parent->children.capacity() / 4) parent->children.shrink_to_fit();
  recharge(parent);
  merge_with_lone_child(parent);
}

// A parent with a single child and the same tenants answers every match() as the child would:
// one node instead of two.
void PrefixTree::merge_with_lone_child(Node* node) {
  if (node == root_.get() || node->children.size() != 1) return;
  Node* child = node->children.front().get();
  if (child->marks.size() != node->marks.size()) return;
  for (const Mark& m : node->marks) {
    if (std::none_of(child->marks.begin(), child->marks.end(), [&](const Mark& c) { return c.tenant == m.tenant; })) {
      return;
    }
  }
  ++maintenance_visits_;
  std::string edge;
  edge.reserve(node->edge.size() + child->edge.size());
  edge.append(node->edge).append(child->edge);
  node->edge = std::move(edge);
  for (Mark& m : node->marks) {
    for (const Mark& c : child->marks) {
      if (c.tenant == m.tenant) m.at = std::max(m.at, c.at);
    }
  }
  for (const Mark& c : child->marks) unref(c.tenant);  // the node keeps one per tenant: no slot frees
  std::unique_ptr<Node> owned = std::move(node->children.front());
  node->children = std::move(owned->children);
  for (auto& grandchild : node->children) grandchild->parent = node;
  unlink(child);  // the node keeps its place, after the child's children
  bytes_ -= child->charged;
  --tree_nodes_;
  recharge(node);
}

void PrefixTree::evict_locked() {
  const size_t target = max_bytes_ / 10 * 9;
  while (bytes_ > target && oldest_ != nullptr) {
    Node* n = oldest_;
    ++maintenance_visits_;
    // The list keeps every node after its descendants, so the oldest is a leaf.
    assert(n->children.empty());
    if (!n->children.empty()) return;
    remove_leaf(n, /*evicted=*/true);
  }
}

// One step per node from the sweep's cursor towards the newest end: retired tenants' marks go,
// and so does a node left with no mark and no child. Children come before their parents, so a
// parent whose children all went is itself visited later in the same pass.
void PrefixTree::sweep_locked(size_t steps) {
  for (; steps > 0 && sweep_ != nullptr; --steps) {
    Node* n = sweep_;
    sweep_ = n->newer;
    ++maintenance_visits_;
    drop_retired_marks(n);
    if (n->marks.empty() && n->children.empty()) {
      remove_leaf(n, /*evicted=*/false);
    } else {
      merge_with_lone_child(n);  // its tenants may now be its lone child's
    }
  }
}

void PrefixTree::remove_tenant(std::string_view tenant) {
  std::lock_guard lock(mu_);
  auto found = tenant_ids_.find(tenant);
  if (found == tenant_ids_.end()) return;
  Tenant& slot = tenants_[found->second];
  tenant_ids_.erase(found);
  slot.live = false;
  sweep_wanted_ = true;
}

PrefixTree::Stats PrefixTree::stats() const {
  std::lock_guard lock(mu_);
  return Stats{bytes_, tree_nodes_, tenant_slots_, evictions_, evicted_nodes_, maintenance_visits_};
}

}  // namespace pdr::router::cache
