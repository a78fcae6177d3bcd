#include "router/topology_watcher.h"

#include "proto/base/log.h"
#include <uv.h>

#include <csignal>
#include <exception>
#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "discovery/config/topology_store.h"

namespace pdr::router {

namespace {

Status uv_error(std::string what, int code) {
  // Appends rather than operator+: GCC 12 reports a false -Wrestrict on the chained form.
  what.append(": ").append(uv_strerror(code));
  return Status(StatusCode::kIoError, std::move(what));
}

void split_path(const std::string& path, std::string* directory, std::string* file_name) {
  std::filesystem::path p(path);
  *directory = p.has_parent_path() ? p.parent_path().string() : std::string(1, '.');
  *file_name = p.filename().string();
}

}  // namespace

// Callbacks are static members so they may name this private type.
struct TopologyWatcher::Impl {
  Impl(uv_loop_t* l, config::TopologyStore& s, Options o)
      : loop(l), store(s), options(std::move(o)) {}

  uv_loop_t* loop;
  config::TopologyStore& store;
  Options options;
  std::string directory;
  std::string file_name;

  uv_fs_event_t fs_event{};
  // watch_also(): one watch per further directory (stable addresses: the handles live in them).
  struct ExtraDirectory {
    Impl* impl = nullptr;
    std::string directory;
    std::vector<std::string> names;  // the listed files in it
    uv_fs_event_t handle{};
    bool initialized = false;
  };
  std::vector<std::unique_ptr<ExtraDirectory>> extra_directories;
  std::vector<std::string> extra_files;          // as listed, for the settle check
  std::vector<std::string> topology_dir_extras;  // listed files in the topology's own directory
  uv_timer_t debounce{};
  uv_signal_t sighup{};
  bool started = false;
  bool fs_event_initialized = false;
  bool debounce_initialized = false;
  bool sighup_initialized = false;
  int handles_closing = 0;

  // What the file looked like at the previous settle check (see the header).
  struct FileSignature {
    int64_t size = -1;  // -1: could not stat
    int64_t mtime_sec = 0, mtime_nsec = 0;
    uint64_t inode = 0;
    bool operator==(const FileSignature&) const = default;
  };
  std::optional<FileSignature> last_signature;
  int settle_rounds = 0;

  static FileSignature signature_of(const std::string& path) {
    FileSignature sig;
    uv_fs_t req;
    if (uv_fs_stat(nullptr, &req, path.c_str(), nullptr) == 0) {
      sig.size = static_cast<int64_t>(req.statbuf.st_size);
      sig.mtime_sec = req.statbuf.st_mtim.tv_sec;
      sig.mtime_nsec = req.statbuf.st_mtim.tv_nsec;
      sig.inode = req.statbuf.st_ino;
    }
    uv_fs_req_cleanup(&req);
    return sig;
  }

  // The topology file's and every watched file's, folded into one (equal only if all are).
  FileSignature signature() const {
    FileSignature sig = signature_of(store.path());
    for (const std::string& path : extra_files) {
      const FileSignature more = signature_of(path);
      sig.size = sig.size * 1000003 + more.size;
      sig.mtime_sec = sig.mtime_sec * 1000003 + more.mtime_sec;
      sig.mtime_nsec = sig.mtime_nsec * 1000003 + more.mtime_nsec;
      sig.inode = sig.inode * 1000003 + more.inode;
    }
    return sig;
  }

  // Debounce elapsed: reload once the file has stopped changing.
  void reload_when_settled() {
    const FileSignature now = signature();
    if ((!last_signature || *last_signature != now) && settle_rounds < options.max_settle_rounds) {
      last_signature = now;
      ++settle_rounds;
      uv_timer_start(&debounce, on_debounce_elapsed, static_cast<uint64_t>(options.settle.count()), 0);
      return;
    }
    if (settle_rounds >= options.max_settle_rounds) {
      pdr::log::warn("topology: {} kept changing for {} settle checks; reading it now", store.path(),
                   settle_rounds);
    }
    reload();
  }

  bool names_topology_file(const char* changed) const {
    // No name: the platform could not say which entry changed, so assume it may be ours.
    if (changed == nullptr) return true;
    // Kubernetes ConfigMap volumes swap a "..data" symlink; the file name itself never changes.
    return file_name == changed || std::string_view(changed) == "..data" ||
           std::find(topology_dir_extras.begin(), topology_dir_extras.end(), changed) != topology_dir_extras.end();
  }

  void reload() {
    uv_timer_stop(&debounce);  // a pending debounced reload would re-read the same file
    last_signature.reset();
    settle_rounds = 0;
    // We are inside a libuv C callback: nothing may propagate out of here.
    try {
      Status s = store.reload();
      if (options.after_reload) options.after_reload(s);
    } catch (const std::exception& e) {
      pdr::log::error("topology reload threw: {}", e.what());
    } catch (...) {
      pdr::log::error("topology reload threw a non-standard exception");
    }
  }

  static void on_debounce_elapsed(uv_timer_t* timer) {
    auto* impl = static_cast<Impl*>(timer->data);
    if (impl->options.settle.count() > 0) {
      impl->reload_when_settled();
    } else {
      impl->reload();
    }
  }

  static void on_directory_event(uv_fs_event_t* handle, const char* changed, int /*events*/,
                                 int status) {
    auto* impl = static_cast<Impl*>(handle->data);
    if (status < 0) {
      pdr::log::warn("topology watch on {} reported an error: {}", impl->directory,
                   uv_strerror(status));
      return;
    }
    if (!impl->names_topology_file(changed)) return;
    // Restarting the timer on each event turns a burst (write, chmod, rename) into one reload.
    uv_timer_start(&impl->debounce, on_debounce_elapsed,
                   static_cast<uint64_t>(impl->options.debounce.count()), 0);
  }

  static void on_extra_directory_event(uv_fs_event_t* handle, const char* changed, int /*events*/, int status) {
    auto* dir = static_cast<ExtraDirectory*>(handle->data);
    Impl* impl = dir->impl;
    if (status < 0) {
      pdr::log::warn("topology watch on {} reported an error: {}", dir->directory, uv_strerror(status));
      return;
    }
    const bool listed = changed == nullptr || std::string_view(changed) == "..data" ||
                        std::find(dir->names.begin(), dir->names.end(), changed) != dir->names.end();
    if (!listed) return;
    uv_timer_start(&impl->debounce, on_debounce_elapsed, static_cast<uint64_t>(impl->options.debounce.count()), 0);
  }

  void watch_also(const std::vector<std::string>& paths) {
    extra_files = paths;
    topology_dir_extras.clear();
    for (auto& dir : extra_directories) dir->names.clear();
    for (const std::string& path : paths) {
      std::string dir_name, file;
      split_path(path, &dir_name, &file);
      if (fs_event_initialized && dir_name == directory) {
        topology_dir_extras.push_back(file);  // the topology's own watch hears it
        continue;
      }
      ExtraDirectory* dir = nullptr;
      for (auto& d : extra_directories) {
        if (d->directory == dir_name) dir = d.get();
      }
      if (dir == nullptr) {
        auto made = std::make_unique<ExtraDirectory>();
        made->impl = this;
        made->directory = dir_name;
        uv_fs_event_init(loop, &made->handle);
        made->handle.data = made.get();
        made->initialized = true;
        if (const int rc = uv_fs_event_start(&made->handle, on_extra_directory_event, dir_name.c_str(), 0); rc < 0) {
          pdr::log::warn("topology: cannot watch {} for changes to {} ({}); SIGHUP rereads it", dir_name, path,
                         uv_strerror(rc));
        }
        dir = made.get();
        extra_directories.push_back(std::move(made));
      }
      dir->names.push_back(file);
    }
  }

  static void on_sighup(uv_signal_t* handle, int /*signum*/) {
    pdr::log::info("SIGHUP: reloading topology");
    static_cast<Impl*>(handle->data)->reload();
  }

  static void on_handle_closed(uv_handle_t* handle) {
    auto* impl = static_cast<Impl*>(handle->data);
    if (--impl->handles_closing == 0) delete impl;
  }

  static void on_extra_handle_closed(uv_handle_t* handle) {
    Impl* impl = static_cast<ExtraDirectory*>(handle->data)->impl;
    if (--impl->handles_closing == 0) delete impl;
  }

  void close_handle(uv_handle_t* handle, bool* initialized) {
    if (!*initialized) return;
    *initialized = false;
    ++handles_closing;
    uv_close(handle, on_handle_closed);
  }

  // Closes every initialised handle; `this` is deleted by the last close callback (or now).
  void close_all() {
    close_handle(reinterpret_cast<uv_handle_t*>(&fs_event), &fs_event_initialized);
    close_handle(reinterpret_cast<uv_handle_t*>(&debounce), &debounce_initialized);
    close_handle(reinterpret_cast<uv_handle_t*>(&sighup), &sighup_initialized);
    for (auto& dir : extra_directories) {
      if (!dir->initialized) continue;
      dir->initialized = false;
      ++handles_closing;
      uv_close(reinterpret_cast<uv_handle_t*>(&dir->handle), on_extra_handle_closed);
    }
    if (handles_closing == 0) delete this;
  }

  Status start() {
    int rc = uv_timer_init(loop, &debounce);
    if (rc < 0) return uv_error("uv_timer_init", rc);
    debounce.data = this;
    debounce_initialized = true;

    if (!store.path().empty()) {
      split_path(store.path(), &directory, &file_name);
      uv_fs_event_init(loop, &fs_event);
      fs_event.data = this;
      fs_event_initialized = true;
      rc = uv_fs_event_start(&fs_event, on_directory_event, directory.c_str(), 0);
      if (rc < 0) return uv_error("watching directory " + directory, rc);
    }
    if (options.reload_on_sighup) {
      rc = uv_signal_init(loop, &sighup);
      if (rc < 0) return uv_error("uv_signal_init", rc);
      sighup.data = this;
      sighup_initialized = true;
      rc = uv_signal_start(&sighup, on_sighup, SIGHUP);
      if (rc < 0) return uv_error("uv_signal_start(SIGHUP)", rc);
    }
    return Status::ok();
  }
};

TopologyWatcher::TopologyWatcher(uv_loop_t* loop, config::TopologyStore& store, Options options)
    : impl_(new Impl(loop, store, std::move(options))) {}

TopologyWatcher::TopologyWatcher(uv_loop_t* loop, config::TopologyStore& store)
    : TopologyWatcher(loop, store, Options{}) {}

TopologyWatcher::~TopologyWatcher() { close(); }

Status TopologyWatcher::start() {
  if (impl_ == nullptr) return Status(StatusCode::kInternal, "topology watcher is closed");
  if (impl_->started) return Status(StatusCode::kInternal, "topology watcher already started");
  impl_->started = true;
  Status s = impl_->start();
  if (!s) close();
  return s;
}

void TopologyWatcher::watch_also(const std::vector<std::string>& paths) {
  if (impl_ != nullptr) impl_->watch_also(paths);
}

void TopologyWatcher::close() {
  if (impl_ == nullptr) return;
  std::exchange(impl_, nullptr)->close_all();
}

}  // namespace pdr::router
