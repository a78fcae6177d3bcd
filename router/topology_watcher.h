// TopologyWatcher: reloads the TopologyStore when the topology file changes or on SIGHUP.
//
// The file's directory is watched (uv_fs_event), not the file: editors and `mv` replace the file,
// which would orphan a watch on the old inode. Events are filtered by file name and debounced (one
// uv_timer restarted by every event), so a save that produces several events reloads once. Then
// the file must settle: its size, mtime and inode are read, and read again `settle` later; only
// when they match is it reloaded, so a writer that truncates and then writes (`cat good > f`,
// `cp`) is read once it has finished, not half-way (TopologyStore also
// refuses an empty file). A file still changing after max_settle_rounds is read anyway. SIGHUP
// (uv_signal) reloads at once. The reload itself is TopologyStore::reload() (validate in full,
// publish or keep the old value). Files the topology names (watch_also: the client key file) are
// watched the same way, their directories too; a change to one reloads the topology, which
// rereads them, and the settle check covers them as well.
//
// Threads: everything, including construction and destruction, runs on the loop's thread. Reloads
// and the after_reload callback run inside that loop's callbacks.
// Ownership: the handles live in a heap block freed by the last uv_close callback, so after close()
// (or destruction) the loop must run once more to finish closing before uv_loop_close().
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "proto/base/status.h"

typedef struct uv_loop_s uv_loop_t;

namespace pdr::config {
class TopologyStore;
}

namespace pdr::router {

class TopologyWatcher {
 public:
  struct Options {
    std::chrono::milliseconds debounce{100};
    std::chrono::milliseconds settle{200};
    int max_settle_rounds = 25;
    bool reload_on_sighup = true;
    // Called on the loop thread after every reload attempt the watcher makes, with its outcome.
    std::function<void(const Status&)> after_reload;
  };

  // `store` must outlive the watcher and have been given its path by load_initial().
  TopologyWatcher(uv_loop_t* loop, config::TopologyStore& store, Options options);
  TopologyWatcher(uv_loop_t* loop, config::TopologyStore& store);
  ~TopologyWatcher();  // close()s if still open
  TopologyWatcher(const TopologyWatcher&) = delete;
  TopologyWatcher& operator=(const TopologyWatcher&) = delete;

  // Starts the directory watch and the SIGHUP handler. With no topology file (store path "") only
  // SIGHUP is watched (a reload then reports there is nothing to re-read). Errors carry libuv's
  // message (e.g. the directory does not exist); on error nothing stays started.
  Status start();

  // The files the current topology reads besides itself (absolute, or relative to the working
  // directory); replaces the previous list. Their directories are watched from now on (a
  // directory once watched stays watched until close(); events for names no longer listed are
  // ignored). A directory that cannot be watched is logged: its file is then reread on SIGHUP.
  void watch_also(const std::vector<std::string>& paths);

  // Stops watching and uv_close()s the handles. Idempotent.
  void close();

 private:
  struct Impl;
  Impl* impl_;  // freed by the last close callback, not by the destructor
};

}  // namespace pdr::router
