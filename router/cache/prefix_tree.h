// What pdrouter itself routed where, for requests without token ids (issue 13): an approximate
// prefix tree of prompt text, as SGLang's gateway and vllm-router keep for their cache-aware
// policies. pdrouter cannot see a text prompt's tokens without a tokenizer, but a node that
// served a prompt most likely still holds the KV of its prefix (vLLM's prefix cache), so the node
// that last served the longest common prefix of this prompt is the best guess.
//
// A radix tree over the prompt's bytes (at most `max_prompt_bytes` of it); each tree node
// remembers which nodes (tenants, by key) routed through it and when. match() answers, per
// tenant, how many leading bytes of the prompt it served. Memory is bounded by `max_bytes` of edge
// text: past it, the least recently used leaves are dropped (a tenant's mark on a leaf first;
// a leaf with no tenant left goes, and its parent merges with a lone child), down to 90% of the
// budget so that eviction runs rarely.
//
// Threading: thread-safe (one mutex; insert and match cost O(prompt bytes)).
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
    size_t bytes = 0;        // edge text held
    size_t tree_nodes = 0;
    uint64_t evictions = 0;  // tenant marks dropped by the budget
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
  // Forgets a tenant (node removed or restarted: its cache is gone).
  void remove_tenant(std::string_view tenant);

  Stats stats() const;

 private:
  struct Node;
  void evict_locked();
  void drop_tenant_from(Node* node, uint32_t tenant);
  uint32_t tenant_id(std::string_view tenant);

  const size_t max_bytes_;
  const size_t max_prompt_bytes_;
  mutable std::mutex mu_;
  std::unique_ptr<Node> root_;
  std::vector<std::string> tenants_;                       // by id
  std::map<std::string, uint32_t, std::less<>> tenant_ids_;
  size_t bytes_ = 0;
  size_t tree_nodes_ = 1;
  uint64_t evictions_ = 0;
};

}  // namespace pdr::router::cache
