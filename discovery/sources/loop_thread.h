// LoopThread: the one thread and libuv loop a discovery source runs on (the Kubernetes pod
// watcher, the etcd registry replicator), with what each of them needs around it: a way in from
// other threads (post), timers, and a stop that lets the source finish its own shutdown first.
//
// Life:
//   start(first, on_stop)   owner's thread: the loop and its wake-up are set up here, then the
//                           thread runs `first` and the loop.
//   post(fn)                any thread: fn runs on the loop thread, in the order posted.
//   timer(what, fn)         loop thread (in `first` or later): a timer owned by the LoopThread.
//   stop()                  owner's thread: the functions posted before it run, then `on_stop`
//                           runs on the loop thread; the source cancels its calls and closes its
//                           clients, now or later (an answer it waits for, under a timer of its
//                           own), and then calls quit(), which closes the wake-up and every
//                           timer. stop() returns once the loop has ended (every handle closed)
//                           and the thread is joined. Without an `on_stop`, stop() quits at once.
//
// Every callback (first, posted functions, timers, on_stop) runs under run_guarded: an exception
// is logged with the component's name and dropped, never unwound through libuv.
//
// post() is refused (false) once stop() has been called; functions posted but not run by then are
// destroyed, not run, after the thread ends. stop() is idempotent, and a no-op before start().
// A LoopThread runs once: start() after stop() is refused.
#pragma once

#include <uv.h>

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "proto/base/status.h"

namespace pdr::discovery::sources {

class LoopThread {
 public:
  // A timer on the loop; created by timer(), it lives as long as its LoopThread. Loop thread only.
  class Timer {
   public:
    // Fires after `delay`, then every `repeat` if not zero; restarts a running timer. No-op once
    // the LoopThread quit.
    void start(std::chrono::milliseconds delay, std::chrono::milliseconds repeat = std::chrono::milliseconds(0));
    void stop();

   private:
    friend class LoopThread;
    uv_timer_t handle_{};
    LoopThread* owner_ = nullptr;
    std::string what_;
    std::function<void()> fn_;
    bool closed_ = false;
  };

  // `component` names the source in the logs ("kubernetes", "etcd registry").
  explicit LoopThread(std::string component);
  ~LoopThread();  // stop()
  LoopThread(const LoopThread&) = delete;
  LoopThread& operator=(const LoopThread&) = delete;

  Status start(std::function<void()> first, std::function<void()> on_stop = {});
  void stop();
  bool post(std::function<void()> fn);

  // Loop thread only, after start().
  uv_loop_t* loop() { return &loop_; }
  Timer& timer(std::string what, std::function<void()> fn);
  // The source's shutdown is over: closes the wake-up and every timer (the loop ends once the
  // source's own handles are closed too). Idempotent. From on_stop or after it: once the wake-up
  // is closed, nothing reaches the loop from another thread.
  void quit();

 private:
  static void on_wake(uv_async_t* handle);
  static void on_timer(uv_timer_t* handle);
  void run_posted();

  std::string component_;
  uv_loop_t loop_{};
  uv_async_t wake_{};
  std::thread thread_;
  bool started_ = false;  // owner's thread: start() succeeded once (a LoopThread runs once)
  std::function<void()> on_stop_;
  std::vector<std::unique_ptr<Timer>> timers_;
  bool quit_ = false;      // loop thread
  bool stopping_ = false;  // loop thread: on_stop has run
  std::mutex mutex_;       // guards the four below; uv_async_send and closing the wake-up under it
  std::deque<std::function<void()>> posted_;
  bool accepting_ = false;  // between start() and stop() (or quit())
  bool stop_requested_ = false;
  bool wake_closed_ = false;
};

}  // namespace pdr::discovery::sources
