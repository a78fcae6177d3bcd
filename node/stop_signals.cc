#include "node/stop_signals.h"

#include <pthread.h>
#include <signal.h>

#include <utility>

namespace pdr::node {
namespace {

sigset_t stop_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

void block_stop_signals() {
  sigset_t set = stop_signal_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

StopSignals::StopSignals(std::function<void(std::string_view)> on_stop)
    : on_stop_(std::move(on_stop)) {
  thread_ = std::thread([this] {
    const sigset_t set = stop_signal_set();
    while (true) {
      int signal_number = 0;
      if (sigwait(&set, &signal_number) != 0) continue;
      if (finished_.load(std::memory_order_acquire)) return;
      on_stop_(signal_number == SIGINT ? "SIGINT" : "SIGTERM");
    }
  });
}

StopSignals::~StopSignals() {
  finished_.store(true, std::memory_order_release);
  // A signal aimed at the waiting thread itself is what wakes sigwait(); the flag makes it exit.
  pthread_kill(thread_.native_handle(), SIGTERM);
  thread_.join();
}

}  // namespace pdr::node
