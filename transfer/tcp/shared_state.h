// What every I/O thread and connection of one TcpBackend reads: the engine context, the options
// and where settled tasks go. Written once in start() before any thread runs, read-only after.
#pragma once

#include <atomic>
#include <cstddef>

#include "transfer/backend.h"
#include "transfer/tcp/task_state.h"
#include "transfer/tcp/tcp_backend.h"

namespace pdr::transfer::tcp {

struct Shared {
  BackendContext context;
  TcpBackendOptions options;
  EngineCounters* counters = nullptr;  // never null once started
  TaskSink* sink = nullptr;
  // Serving connections alive (accepted and not yet closed), against options.max_connections.
  // Incremented by the accepting thread, decremented by the thread that closes the connection.
  mutable std::atomic<std::size_t> serving_connections{0};
};

// One socket watched by an I/O thread's epoll; on_events runs on that thread only.
class Connection {
 public:
  virtual ~Connection() = default;
  virtual void on_events(std::uint32_t events) = 0;
};

}  // namespace pdr::transfer::tcp
