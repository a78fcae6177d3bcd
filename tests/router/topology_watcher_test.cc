#include "router/topology_watcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <uv.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "discovery/config/topology_store.h"

namespace pdr::router {
namespace {

using config::PolicyName;
using config::Topology;
using config::TopologyStore;
using ::testing::StartsWith;
using namespace std::chrono_literals;

// A real loop run on the test thread. run() returns when a callback calls stop() or when the
// overall deadline fires (timed_out() then says so).
class TopologyWatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(uv_loop_init(&loop_), 0);
    std::string templ = (std::filesystem::temp_directory_path() / "pdr-watch-XXXXXX").string();
    ASSERT_NE(::mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    path_ = dir_ + "/topo.yaml";
  }

  void TearDown() override {
    // Handles closed by the test (watcher destructors) finish closing here.
    uv_run(&loop_, UV_RUN_DEFAULT);
    EXPECT_EQ(uv_loop_close(&loop_), 0) << "a handle was left open";
    std::filesystem::remove_all(dir_);
  }

  void run_until_stopped() {
    uv_timer_t deadline;
    uv_timer_init(&loop_, &deadline);
    deadline.data = this;
    timed_out_ = false;
    uv_timer_start(
        &deadline,
        [](uv_timer_t* t) {
          auto* self = static_cast<TopologyWatcherTest*>(t->data);
          self->timed_out_ = true;
          uv_stop(&self->loop_);
        },
        10'000, 0);
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_close(reinterpret_cast<uv_handle_t*>(&deadline), nullptr);
    uv_run(&loop_, UV_RUN_NOWAIT);  // finish closing `deadline` before it leaves scope
  }

  void stop() { uv_stop(&loop_); }

  void write_in_place(const std::string& content) {
    std::ofstream(path_, std::ios::trunc) << content;
  }

  // The way editors save: write a temporary file beside it, then rename over the original.
  void replace_by_rename(const std::string& content) {
    const std::string tmp = dir_ + "/.topo.yaml.swp";
    std::ofstream(tmp, std::ios::trunc) << content;
    ASSERT_EQ(std::rename(tmp.c_str(), path_.c_str()), 0);
  }

  uv_loop_t loop_{};
  bool timed_out_ = false;
  std::string dir_;
  std::string path_;
};

TEST_F(TopologyWatcherTest, RenamedFileIsReloaded) {
  write_in_place("policies: {decode: round_robin}\n");
  TopologyStore store;
  ASSERT_TRUE(store.load_initial(path_).is_ok());
  PolicyName observed = PolicyName::kRoundRobin;
  int listener_calls = 0;
  store.add_listener([&](const Topology& old_t, const Topology& new_t) {
    EXPECT_EQ(old_t.policies.decode, PolicyName::kRoundRobin);
    observed = new_t.policies.decode;
    ++listener_calls;
    stop();
  });
  TopologyWatcher::Options options;
  options.debounce = 50ms;
  TopologyWatcher watcher(&loop_, store, options);
  Status s = watcher.start();
  ASSERT_TRUE(s.is_ok()) << s.to_string();

  // Unrelated files in the same directory are ignored; ours is replaced by rename.
  std::ofstream(dir_ + "/other.yaml") << "workers: 1\n";
  replace_by_rename("policies: {decode: power_of_two}\n");
  run_until_stopped();

  EXPECT_FALSE(timed_out_) << "no reload within 10 s";
  EXPECT_EQ(listener_calls, 1);
  EXPECT_EQ(observed, PolicyName::kPowerOfTwo);
  EXPECT_EQ(store.current()->policies.decode, PolicyName::kPowerOfTwo);
  EXPECT_EQ(store.reloads_ok(), 1u);
  EXPECT_EQ(store.reloads_failed(), 0u);
}

TEST_F(TopologyWatcherTest, AFileTheTopologyNamesElsewhereReloadsIt) {
  // The client key file, in a directory of its own: its change rereads the topology.
  const std::filesystem::path keys_dir = std::filesystem::path(dir_) / "keys";
  std::filesystem::create_directory(keys_dir);
  const std::string keys = (keys_dir / "clients.keys").string();
  std::ofstream(keys) << "sk-team-a-0123456789abcdef team-a\n";
  write_in_place("client_auth: {keys_file: " + keys + "}\n");
  TopologyStore store;
  ASSERT_TRUE(store.load_initial(path_).is_ok());
  int listener_calls = 0;
  store.add_listener([&](const Topology&, const Topology& new_t) {
    ++listener_calls;
    EXPECT_EQ(new_t.client_auth.keys.keys.size(), 2u);
    stop();
  });
  TopologyWatcher::Options options;
  options.debounce = 50ms;
  options.settle = 50ms;
  TopologyWatcher watcher(&loop_, store, options);
  ASSERT_TRUE(watcher.start().is_ok());
  watcher.watch_also({store.current()->client_auth.keys_path});
  std::ofstream(keys_dir / "unrelated") << "x\n";
  const std::string tmp = keys + ".tmp";
  std::ofstream(tmp) << "sk-team-a-0123456789abcdef team-a\nsk-team-b-0123456789abcdef team-b\n";
  ASSERT_EQ(std::rename(tmp.c_str(), keys.c_str()), 0);
  run_until_stopped();
  EXPECT_FALSE(timed_out_) << "no reload within 10 s";
  EXPECT_EQ(listener_calls, 1);
  ASSERT_NE(store.current()->client_auth.keys.find("sk-team-b-0123456789abcdef"), nullptr);
}

TEST_F(TopologyWatcherTest, SighupReloads) {
  write_in_place("workers: 1\n");
  TopologyStore store;
  ASSERT_TRUE(store.load_initial(path_).is_ok());
  uint32_t observed_workers = 0;
  store.add_listener([&](const Topology&, const Topology& new_t) {
    observed_workers = new_t.workers;
    stop();
  });
  // Written before the watch starts, so only the signal can make the store notice it.
  write_in_place("workers: 2\n");
  TopologyWatcher watcher(&loop_, store);
  Status s = watcher.start();
  ASSERT_TRUE(s.is_ok()) << s.to_string();

  ASSERT_EQ(std::raise(SIGHUP), 0);
  run_until_stopped();

  EXPECT_FALSE(timed_out_) << "SIGHUP did not reload within 10 s";
  EXPECT_EQ(observed_workers, 2u);
  EXPECT_EQ(store.current()->workers, 2u);
  EXPECT_EQ(store.reloads_ok(), 1u);
}

TEST_F(TopologyWatcherTest, InvalidRewriteKeepsOldTopology) {
  write_in_place("retries: {prefill_attempts: 3}\n");
  TopologyStore store;
  ASSERT_TRUE(store.load_initial(path_).is_ok());
  int listener_calls = 0;
  store.add_listener([&](const Topology&, const Topology&) { ++listener_calls; });
  Status outcome;
  TopologyWatcher::Options options;
  options.debounce = 50ms;
  options.after_reload = [&](const Status& s) {
    outcome = s;
    stop();
  };
  TopologyWatcher watcher(&loop_, store, options);
  ASSERT_TRUE(watcher.start().is_ok());

  replace_by_rename("retries: {prefill_attempts: 0}\n");
  run_until_stopped();

  EXPECT_FALSE(timed_out_) << "no reload attempt within 10 s";
  EXPECT_FALSE(outcome.is_ok());
  EXPECT_EQ(store.reloads_failed(), 1u);
  EXPECT_EQ(store.reloads_ok(), 0u);
  EXPECT_EQ(listener_calls, 0);
  EXPECT_EQ(store.current()->retries.prefill_attempts, 3u);
  EXPECT_THAT(store.last_error(),
              StartsWith(path_ + ":1:29: retries.prefill_attempts: 0 is out of range"));
}

// A half-written file: `: > topo.yaml` then (a moment later) the good file written in place.
// The watcher waits for the file to settle, so the truncated state is never read; and were it
// read, the store refuses an empty file. Either way the running topology survives.
TEST_F(TopologyWatcherTest, TruncateThenWriteReloadsOnlyTheFinishedFile) {
  write_in_place("retries: {prefill_attempts: 3}\n");
  TopologyStore store;
  ASSERT_TRUE(store.load_initial(path_).is_ok());
  std::vector<Status> outcomes;
  std::vector<uint32_t> seen_attempts;
  TopologyWatcher::Options options;
  options.debounce = 20ms;
  options.settle = 200ms;
  options.after_reload = [&](const Status& s) {
    outcomes.push_back(s);
    seen_attempts.push_back(store.current()->retries.prefill_attempts);
    stop();
  };
  TopologyWatcher watcher(&loop_, store, options);
  ASSERT_TRUE(watcher.start().is_ok());

  write_in_place("");  // the writer truncated...
  uv_timer_t writer;
  uv_timer_init(&loop_, &writer);
  writer.data = &path_;
  uv_timer_start(
      &writer,
      [](uv_timer_t* t) {  // ...and writes 60 ms later (before the settle check is due)
        std::ofstream(*static_cast<std::string*>(t->data), std::ios::trunc)
            << "retries: {prefill_attempts: 4}\n";
      },
      60, 0);
  run_until_stopped();
  uv_close(reinterpret_cast<uv_handle_t*>(&writer), nullptr);
  uv_run(&loop_, UV_RUN_NOWAIT);  // finish closing `writer` before it leaves scope

  EXPECT_FALSE(timed_out_) << "no reload within 10 s";
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_TRUE(outcomes[0].is_ok()) << outcomes[0].to_string();
  EXPECT_EQ(seen_attempts[0], 4u);
  EXPECT_EQ(store.reloads_failed(), 0u);
  EXPECT_EQ(store.reloads_ok(), 1u);
}

// A file left empty is read once it settles, and refused: counted, logged, topology kept.
TEST_F(TopologyWatcherTest, EmptiedFileIsAFailedReload) {
  write_in_place("retries: {prefill_attempts: 3}\n");
  TopologyStore store;
  ASSERT_TRUE(store.load_initial(path_).is_ok());
  Status outcome;
  TopologyWatcher::Options options;
  options.debounce = 20ms;
  options.settle = 50ms;
  options.after_reload = [&](const Status& s) {
    outcome = s;
    stop();
  };
  TopologyWatcher watcher(&loop_, store, options);
  ASSERT_TRUE(watcher.start().is_ok());
  write_in_place("");
  run_until_stopped();

  EXPECT_FALSE(timed_out_) << "no reload attempt within 10 s";
  EXPECT_FALSE(outcome.is_ok());
  EXPECT_THAT(outcome.message(), ::testing::HasSubstr("the file is empty"));
  EXPECT_EQ(store.reloads_failed(), 1u);
  EXPECT_EQ(store.current()->retries.prefill_attempts, 3u);
}

// A Kubernetes ConfigMap volume: the file is a symlink through "..data", itself a symlink to a
// timestamped directory; an update writes a new directory and renames a new "..data" over the old
// one, so neither the file's name nor its directory entry ever changes. The watcher must still
// see the swap (the "..data" rename) and read the new content through the links.
TEST_F(TopologyWatcherTest, ConfigMapSymlinkSwapIsReloaded) {
  namespace fs = std::filesystem;
  const fs::path dir(dir_);
  fs::create_directory(dir / "..2026_11_26_00_00_00.1");
  std::ofstream(dir / "..2026_11_26_00_00_00.1" / "topo.yaml") << "retries: {prefill_attempts: 3}\n";
  fs::create_directory_symlink("..2026_11_26_00_00_00.1", dir / "..data");
  fs::create_symlink("..data/topo.yaml", dir / "topo.yaml");
  TopologyStore store;
  ASSERT_TRUE(store.load_initial(path_).is_ok());
  ASSERT_EQ(store.current()->retries.prefill_attempts, 3u);
  std::vector<Status> outcomes;
  TopologyWatcher::Options options;
  options.debounce = 20ms;
  options.settle = 50ms;
  options.after_reload = [&](const Status& s) {
    outcomes.push_back(s);
    stop();
  };
  TopologyWatcher watcher(&loop_, store, options);
  ASSERT_TRUE(watcher.start().is_ok());

  // What the kubelet does: new data directory, a temporary link to it renamed over "..data",
  // then the old directory removed.
  fs::create_directory(dir / "..2026_11_26_00_01_00.2");
  std::ofstream(dir / "..2026_11_26_00_01_00.2" / "topo.yaml") << "retries: {prefill_attempts: 5}\n";
  fs::create_directory_symlink("..2026_11_26_00_01_00.2", dir / "..data_tmp");
  fs::rename(dir / "..data_tmp", dir / "..data");
  fs::remove_all(dir / "..2026_11_26_00_00_00.1");
  run_until_stopped();

  EXPECT_FALSE(timed_out_) << "the ConfigMap swap was not seen within 10 s";
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_TRUE(outcomes[0].is_ok()) << outcomes[0].to_string();
  EXPECT_EQ(store.current()->retries.prefill_attempts, 5u);
  EXPECT_EQ(store.reloads_ok(), 1u);
}

TEST_F(TopologyWatcherTest, MissingDirectoryFailsToStart) {
  TopologyStore store;
  ASSERT_TRUE(store.load_initial("").is_ok());
  // load_initial("") leaves no path: only SIGHUP is watched, which must start fine.
  TopologyWatcher sighup_only(&loop_, store);
  EXPECT_TRUE(sighup_only.start().is_ok());
  sighup_only.close();
  sighup_only.close();  // idempotent

  const std::string gone = dir_ + "/gone";
  std::filesystem::create_directory(gone);
  std::ofstream(gone + "/topo.yaml") << "workers: 1\n";
  TopologyStore store2;
  ASSERT_TRUE(store2.load_initial(gone + "/topo.yaml").is_ok());
  std::filesystem::remove_all(gone);
  TopologyWatcher watcher(&loop_, store2);
  Status s = watcher.start();
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_THAT(s.message(), StartsWith("watching directory " + gone + ": "));
}

}  // namespace
}  // namespace pdr::router
