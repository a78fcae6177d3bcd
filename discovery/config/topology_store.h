// TopologyStore: the current topology, published to readers on any thread, replaced by reloads.
//
// Threads:
//   * load_initial(), reload(), add_listener(): the control thread (the main loop thread that also
//     runs TopologyWatcher). reload() is serialised internally, so a stray call from another thread
//     is safe but still runs listeners on that thread.
//   * cell(), current(), path(), the counters, last_error(), last_reload(): any thread.
// A reload validates the whole file first (see load_topology_file). Only a valid topology is
// published; a bad one leaves the current value in place, is logged (a warning), counted in
// reloads_failed, and its message kept in last_error(). The store never decides what a change
// means: listeners receive (old, new) and restart_required_changes() lists what cannot apply live.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "proto/base/snapshot_cell.h"
#include "discovery/config/topology.h"
#include "proto/base/status.h"

namespace pdr::config {

class TopologyStore {
 public:
  // Runs on the thread that called reload(), after the new value is published. Must not call
  // reload() on this store (it would deadlock).
  using Listener = std::function<void(const Topology& old_t, const Topology& new_t)>;
  using TimePoint = std::chrono::system_clock::time_point;

  TopologyStore();  // holds the defaults (as an empty file would give) until load_initial()
  TopologyStore(const TopologyStore&) = delete;
  TopologyStore& operator=(const TopologyStore&) = delete;

  // Loads `path` ("" = defaults, and reload() has nothing to re-read) and publishes it. On error
  // nothing is published and the error is returned; no counter moves and no listener runs.
  Status load_initial(const std::string& path);

  // Re-reads the path given to load_initial(). A file that is empty (or whitespace only) is a
  // failed reload: it is what a writer that truncates first leaves for a moment, never a topology
  // to apply live. On success publishes the new value, clears last_error, calls every listener,
  // then bumps reloads_ok. On failure keeps the current value, stores the message in last_error,
  // then bumps reloads_failed, and logs. So a reader on another thread that sees a count move
  // also sees that reload's last_error and, for a success, what its listeners applied. Without a
  // path returns kNotFound and counts nothing.
  Status reload();

  // Listeners run only for reload() successes, in registration order.
  void add_listener(Listener listener);

  const SnapshotCell<Topology>& cell() const { return cell_; }
  std::shared_ptr<const Topology> current() const { return cell_.load(); }
  const std::string& path() const { return path_; }  // set once by load_initial()

  uint64_t reloads_ok() const { return reloads_ok_.load(std::memory_order_acquire); }
  uint64_t reloads_failed() const { return reloads_failed_.load(std::memory_order_acquire); }
  // Message of the most recent reload() if it failed ("FILE:LINE:COL: key: what"); "" otherwise.
  std::string last_error() const;
  // Wall-clock end of the most recent reload() attempt, successful or not.
  std::optional<TimePoint> last_reload() const;

 private:
  void record_outcome(const Status& status);

  SnapshotCell<Topology> cell_;
  std::string path_;
  std::mutex reload_mutex_;  // one reload at a time: publish order = read order
  std::mutex listeners_mutex_;
  std::vector<Listener> listeners_;
  std::atomic<uint64_t> reloads_ok_{0};
  std::atomic<uint64_t> reloads_failed_{0};
  mutable std::mutex outcome_mutex_;  // guards last_error_ and last_reload_
  std::string last_error_;
  std::optional<TimePoint> last_reload_;
};

// Fields that differ between `a` and `b` but only take effect on restart (listeners.http, listeners.admin,
// listeners.discovery, workers, kv_events.*), each as "name: OLD -> NEW". Empty when a live reload covers it
// all.
std::vector<std::string> restart_required_changes(const Topology& a, const Topology& b);

}  // namespace pdr::config
