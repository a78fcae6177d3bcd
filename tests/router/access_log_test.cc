// The access log's writer thread (router/clients/access_log.h) against real files and FIFOs: lines
// reach the file, a reopen follows a rotated file, and an output that takes nothing makes log()
// drop, never wait.
#include "router/clients/access_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "tests/support/time_scale.h"

namespace pdr::router::clients {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class TempDir {
 public:
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "pdr-alog-XXXXXX").string();
    path_ = ::mkdtemp(templ.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

AccessRecord record(int n) {
  AccessRecord r;
  r.time = std::chrono::system_clock::now();
  r.tenant = "t";
  r.method = "POST";
  r.path = "/v1/completions";
  r.status = 200;
  r.request_id = "req-" + std::to_string(n);
  return r;
}

std::vector<nlohmann::json> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds bound = 5000ms) {
  const auto deadline = Clock::now() + test::scaled(bound);
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(2ms);
  }
  return pred();
}

TEST(AccessLog, OffByDefaultAndDropsWhileOff) {
  AccessLog log;
  EXPECT_FALSE(log.enabled());
  log.log(record(1));
  EXPECT_EQ(log.dropped(), 1u);
  EXPECT_EQ(log.lines(), 0u);
}

TEST(AccessLog, WritesLinesInOrderAndReopensAfterRotation) {
  TempDir dir;
  const std::string path = dir.file("access.log");
  AccessLog log;
  log.configure(path, 100);
  ASSERT_TRUE(log.enabled());
  for (int i = 0; i < 10; ++i) log.log(record(i));
  ASSERT_TRUE(eventually([&] { return log.lines() == 10; }));
  auto lines = lines_of(path);
  ASSERT_EQ(lines.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(lines[i]["request_id"], "req-" + std::to_string(i));
  EXPECT_EQ((std::filesystem::status(path).permissions() & std::filesystem::perms::others_read),
            std::filesystem::perms::none);

  // logrotate: rename, then reopen; new lines go to a new file at the path.
  std::filesystem::rename(path, path + ".1");
  log.reopen();
  log.log(record(10));
  ASSERT_TRUE(eventually([&] { return log.lines() == 11; }));
  EXPECT_EQ(lines_of(path + ".1").size(), 10u);
  lines = lines_of(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["request_id"], "req-10");

  // Another path switches the output; "" turns it off.
  log.configure(dir.file("other.log"), 100);
  log.log(record(11));
  ASSERT_TRUE(eventually([&] { return log.lines() == 12; }));
  EXPECT_EQ(lines_of(dir.file("other.log")).size(), 1u);
  log.configure("", 100);
  EXPECT_FALSE(log.enabled());
  log.log(record(12));
  EXPECT_EQ(log.lines(), 12u);
  EXPECT_EQ(log.errors(), 0u);
}

TEST(AccessLog, StopWritesWhatIsQueuedWithoutWaitingOutTheBatch) {
  // The writer gathers lines for kFlushInterval before it writes; stopping cuts that short and
  // still writes every line queued.
  TempDir dir;
  const std::string path = dir.file("access.log");
  for (int round = 0; round < 3; ++round) {
    auto log = std::make_unique<AccessLog>();
    log->configure(path, 100);
    for (int i = 0; i < 5; ++i) log->log(record(round * 5 + i));
    const auto stop = Clock::now();
    log.reset();
    EXPECT_LT(Clock::now() - stop, AccessLog::kStopFlush);
    EXPECT_EQ(lines_of(path).size(), static_cast<size_t>(round * 5 + 5));
  }
  const auto lines = lines_of(path);
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(lines[i]["request_id"], "req-" + std::to_string(i));
}

TEST(AccessLog, AnOutputThatTakesNothingMakesLogDropNotWait) {
  TempDir dir;
  const std::string fifo = dir.file("access.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // A reader that holds the FIFO open and never reads: the pipe fills, then writes would block.
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  auto log = std::make_unique<AccessLog>();
  log->configure(fifo, 64);
  const auto start = Clock::now();
  for (int i = 0; i < 20000; ++i) log->log(record(i));  // ~2 MB of lines: far more than a pipe holds
  const auto took = Clock::now() - start;
  EXPECT_LT(took, test::scaled(2s)) << "log() waited for the output";
  EXPECT_GT(log->dropped(), 10000u);
  EXPECT_LT(log->lines(), 20000u - 10000u);
  // Stopping gives up on the blocked output after its flush time rather than hanging.
  const auto stop = Clock::now();
  log.reset();
  EXPECT_LT(Clock::now() - stop, AccessLog::kStopFlush + test::scaled(2s));
  ::close(reader);
}

TEST(AccessLog, AFifoWithoutReaderIsRetriedNotWaitedFor) {
  // The reader goes away before the log stops, and lines still queued then (the writer gathers
  // them for kFlushInterval) meet a FIFO without a reader: EPIPE, as in pdrouter, whose main()
  // ignores SIGPIPE; without that the signal would end the test binary.
  std::signal(SIGPIPE, SIG_IGN);
  TempDir dir;
  const std::string fifo = dir.file("access.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  AccessLog log;
  log.configure(fifo, 100);
  log.log(record(1));
  ASSERT_TRUE(eventually([&] { return log.dropped() == 1 && log.errors() == 1; }));
  // A reader appears: the next open (after its back-off) succeeds and lines flow.
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  ASSERT_TRUE(eventually(
      [&] {
        log.log(record(2));
        std::this_thread::sleep_for(20ms);
        return log.lines() > 0;
      },
      5000ms));
  char buf[4096];
  const ssize_t n = ::read(reader, buf, sizeof buf);
  ASSERT_GT(n, 0);
  EXPECT_NE(std::string(buf, static_cast<size_t>(n)).find("\"request_id\":\"req-2\""), std::string::npos);
  ::close(reader);
}

}  // namespace
}  // namespace pdr::router::clients
