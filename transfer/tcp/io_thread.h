// IoThread: one epoll loop of the TCP backend (T-7). It owns the lanes and accepted connections
// assigned to it; other threads reach it only through post() (a mutex-guarded command list plus an
// eventfd wake-up, taken once per batch of commands, not per frame). The thread that owns the
// listener accepts and spreads new connections round robin over all IoThreads; an accept that would
// exceed options.max_connections serving connections is closed at once (connections_refused). Each
// loop also closes its serving connections that did not authenticate by their HELLO deadline.
//
// Threads: post() and closed-for-posting checks from any thread; everything else (watch, rewatch,
// unwatch, retire) only from the loop thread itself, i.e. from code running inside a Connection.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "proto/base/status.h"
#include "transfer/tcp/shared_state.h"
#include "transfer/tcp/task_state.h"

namespace pdr::transfer::tcp {

class Lane;
class ServingConnection;

struct Command {
  enum class Kind : std::uint8_t {
    kAddLane,     // take ownership of `lane`
    kRemoveLane,  // settle its work kPeerGone and destroy it
    kSubmit,      // lane->submit(batch)
    kCancel,      // settle every batch of xfer_id with `cause`
    kAdopt,       // serve the accepted socket `fd`
    kStop,        // settle everything kPeerGone, close all sockets, leave the loop
  };
  Kind kind = Kind::kStop;
  Lane* lane = nullptr;
  Batch* batch = nullptr;
  std::uint64_t xfer_id = 0;
  XferCause cause = XferCause::kNone;
  int fd = -1;
};

class IoThread {
 public:
  explicit IoThread(const Shared& shared);
  ~IoThread();  // after join(); frees whatever the loop left (nothing, if it ran kStop)
  IoThread(const IoThread&) = delete;
  IoThread& operator=(const IoThread&) = delete;

  // Creates the epoll and eventfd. Before start().
  Status init();
  // The listener (owned from now on) and the threads accepted sockets go to. Before start().
  void set_listener(int fd, std::vector<IoThread*> acceptors);
  void start();
  void join();

  // Queues a command. False once the loop has processed kStop: the command was not taken (the
  // caller still owns `batch`/`lane`/`fd`).
  bool post(const Command& command);

  // ---- loop thread only ----
  void watch(int fd, Connection* connection, std::uint32_t events);
  void rewatch(int fd, Connection* connection, std::uint32_t events);
  void unwatch(int fd);
  // A closed serving connection: destroyed after the current round of events.
  void retire(ServingConnection* connection);

 private:
  void run();
  void run_commands();
  void execute(const Command& command);
  void accept_all();
  void expire_unauthenticated(Clock::time_point now);
  void shut_down();
  int next_timeout_ms() const;

  const Shared& shared_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  int listen_fd_ = -1;
  std::vector<IoThread*> acceptors_;
  std::size_t next_acceptor_ = 0;
  std::thread thread_;
  char wake_tag_ = 0;    // epoll data for the eventfd
  char listen_tag_ = 0;  // epoll data for the listener

  std::mutex mu_;
  std::vector<Command> commands_;  // guarded by mu_
  bool closed_ = false;            // guarded by mu_: kStop ran, post() refuses
  std::vector<Command> running_;   // loop thread: the batch being executed
  bool stopping_ = false;          // loop thread

  std::vector<std::unique_ptr<Lane>> lanes_;
  std::vector<std::unique_ptr<ServingConnection>> serving_;
  std::vector<std::unique_ptr<Connection>> graveyard_;
};

}  // namespace pdr::transfer::tcp
