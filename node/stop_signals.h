// StopSignals: turns SIGTERM/SIGINT into a call on a dedicated thread, for long-running pdnode
// commands.
//
// Contract: block_stop_signals() must run in main() before any other thread exists, so every
// thread inherits the blocked mask and no thread is interrupted by these signals. A StopSignals
// object then starts one thread that waits for them with sigwait() and calls `on_stop` (once per
// signal received, with the signal's name). Destroying the object ends that thread without
// calling on_stop.
#pragma once

#include <atomic>
#include <functional>
#include <string_view>
#include <thread>

namespace pdr::node {

void block_stop_signals();

class StopSignals {
 public:
  explicit StopSignals(std::function<void(std::string_view signal_name)> on_stop);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  std::function<void(std::string_view)> on_stop_;
  std::atomic<bool> finished_{false};
  std::thread thread_;
};

}  // namespace pdr::node
