// What pdrouter itself routed where, for requests without token ids: an approximate prefix tree
// of prompt text, as SGLang's gateway and vllm-router keep for their cache-aware policies.
// pdrouter cannot see a text prompt's tokens without a tokenizer, but a node that served a prompt
// most likely still holds the KV of its prefix (vLLM's prefix cache), so the node that last served
// the longest common prefix of this prompt is the best guess.
//
// A radix tree over the prompt's bytes (at most `max_prompt_bytes` of it); each tree node
// remembers which nodes (tenants, by key) routed through it and when (a mark per tenant).
// match() answers, per tenant, how many leading bytes of the prompt it served.
//
// Memory: `max_bytes` bounds what the tree allocates, not just its text. Each tree node is charged
// its own allocation, its slot in its parent's child list, its marks, and its edge text when that
// does not fit the string's inline buffer, each as a heap allocation of that size costs
// (heap_cost: glibc's 16-byte rounding and 8-byte header); each tenant is charged its key and its
// table entries. A short-edged node with two tenants costs about 190 bytes, so trie-shaped prompts
// (one or two new nodes each) fill the default 64 MiB with about 350,000 nodes. Past the budget
// the least recently used leaves go, down to 90% of it, so that eviction runs rarely.
//
// Eviction costs O(nodes evicted): every tree node but the root sits in one list in the order it
// was last used (inserted through), and an insert moves its path to the newest end deepest node
// first, so each node comes after all of its descendants; the oldest end is therefore always the
// least recently used leaf. A parent left with a single child that has the same tenants merges
// with it (one node instead of two for the same answers).
//
// Tenants go lazily: remove_tenant() (a node left or restarted; its cache is gone) only retires
// the key's slot, O(log tenants), and the key gets a fresh slot (a new generation) if it comes
// back. match() ignores the marks of retired slots. Each insert sweeps a few nodes of the list
// (proportional to its own path) dropping such marks and the leaves left without any, so one full
// pass after a removal cleans the whole tree without any call walking it. A slot is reused once no
// mark names it, so the tenant table holds only tenants with marks in the tree.
//
// Threading: thread-safe (one mutex; insert and match cost O(prompt bytes), remove_tenant
// O(log tenants)).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace pdr::router::cache {

class PrefixTree {
 public:
  using Clock = std::chrono::steady_clock;

  struct Match {
    std::string tenant;
    size_t matched_bytes = 0;
  };
  struct Stats {
    size_t bytes = 0;            // memory charged to the budget (tree nodes, marks, text, tenants)
    size_t tree_nodes = 0;       // including the root
    size_t tenants = 0;          // tenant slots held: live, or retired but still named by a mark
    uint64_t evictions = 0;      // tenant marks dropped by the budget
    uint64_t evicted_nodes = 0;  // tree nodes dropped by the budget
    // Tree nodes visited by eviction and by the retired-tenant sweep (tests bound this work).
    uint64_t maintenance_visits = 0;
  };

  explicit PrefixTree(size_t max_bytes = 64 << 20, size_t max_prompt_bytes = 16 << 10);
  ~PrefixTree();
  PrefixTree(const PrefixTree&) = delete;
  PrefixTree& operator=(const PrefixTree&) = delete;

  // `tenant` served `prompt` (its first max_prompt_bytes).
  void insert(std::string_view prompt, std::string_view tenant, Clock::time_point now);
  // Per tenant that served at least the first byte, its longest common prefix with `prompt`;
  // longest first (ties by tenant).
  std::vector<Match> match(std::string_view prompt) const;
  // Forgets a tenant (node removed or restarted: its cache is gone): at once for match(), its
  // marks' memory over the following inserts.
  void remove_tenant(std::string_view tenant);

  Stats stats() const;

  // What a heap allocation of `n` bytes costs (0 for none).
  static constexpr size_t heap_cost(size_t n) {
    if (n == 0) return 0;
    const size_t chunk = (n + 8 + 15) / 16 * 16;
    return chunk < 32 ? 32 : chunk;
  }

 private:
  struct Node;
  struct Mark;
  struct Tenant {
    std::string key;
    uint32_t marks = 0;  // marks naming this slot
    uint32_t charged = 0;
    bool live = false;   // false: retired (remove_tenant) or free
  };

  uint32_t tenant_id(std::string_view tenant);
  void ref(uint32_t tenant);
  void unref(uint32_t tenant);
  void mark(Node* node, uint32_t tenant, Clock::time_point now);
  void drop_retired_marks(Node* node);
  void recharge(Node* node);
  // LRU list.
  void link_after(Node* node, Node* older);
  void unlink(Node* node);
  void move_to_newest(Node* node);
  // Removes a leaf (`evicted`: by the budget), then merges its parent with a lone child if it can.
  void remove_leaf(Node* leaf, bool evicted);
  void merge_with_lone_child(Node* node);
  void evict_locked();
  void sweep_locked(size_t steps);

  const size_t max_bytes_;
  const size_t max_prompt_bytes_;
  mutable std::mutex mu_;
  std::unique_ptr<Node> root_;
  Node* oldest_ = nullptr;  // LRU list ends (the root is not in it)
  Node* newest_ = nullptr;
  Node* sweep_ = nullptr;   // next node of the retired-tenant sweep; null: no pass under way
  bool sweep_wanted_ = false;  // a tenant was retired since the current pass started
  std::vector<Tenant> tenants_;                              // by id
  std::vector<uint32_t> free_tenants_;                       // ids of free slots
  std::map<std::string, uint32_t, std::less<>> tenant_ids_;  // live slots only
  size_t bytes_ = 0;
  size_t tree_nodes_ = 1;
  size_t tenant_slots_ = 0;
  uint64_t evictions_ = 0;
  uint64_t evicted_nodes_ = 0;
  uint64_t maintenance_visits_ = 0;
};

}  // namespace pdr::router::cache
