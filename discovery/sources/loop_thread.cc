#include "discovery/sources/loop_thread.h"

#include <utility>

#include "proto/base/guarded.h"

namespace pdr::discovery::sources {

LoopThread::LoopThread(std::string component) : component_(std::move(component)) {}

LoopThread::~LoopThread() { stop(); }

Status LoopThread::start(std::function<void()> first, std::function<void()> on_stop) {
  if (started_) return Status(StatusCode::kInternal, component_ + ": a loop thread starts once");
  if (uv_loop_init(&loop_) != 0) return Status(StatusCode::kInternal, component_ + ": uv_loop_init failed");
  // Set up on this thread, before the loop runs, so post() and stop() may be called as soon as
  // start() returns.
  uv_async_init(&loop_, &wake_, &LoopThread::on_wake);
  wake_.data = this;
  started_ = true;
  on_stop_ = std::move(on_stop);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    accepting_ = true;
    stop_requested_ = false;
  }
  thread_ = std::thread([this, first = std::move(first)] {
    if (first) run_guarded(component_, "start", first);
    uv_run(&loop_, UV_RUN_DEFAULT);
  });
  return Status::ok();
}

void LoopThread::stop() {
  if (!thread_.joinable()) return;
  {
    // Sent under the lock, as post() does: the loop thread closes the wake-up under it too.
    std::lock_guard<std::mutex> lock(mutex_);
    stop_requested_ = true;
    accepting_ = false;
    if (!wake_closed_) uv_async_send(&wake_);
  }
  thread_.join();
  uv_loop_close(&loop_);
  std::lock_guard<std::mutex> lock(mutex_);
  posted_.clear();
}

bool LoopThread::post(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!accepting_) return false;
  posted_.push_back(std::move(fn));
  uv_async_send(&wake_);
  return true;
}

LoopThread::Timer& LoopThread::timer(std::string what, std::function<void()> fn) {
  auto timer = std::make_unique<Timer>();
  timer->owner_ = this;
  timer->what_ = std::move(what);
  timer->fn_ = std::move(fn);
  uv_timer_init(&loop_, &timer->handle_);
  timer->handle_.data = timer.get();
  // A timer made after quit() would keep the loop from ending: it starts closed.
  if (quit_) {
    timer->closed_ = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&timer->handle_), nullptr);
  }
  timers_.push_back(std::move(timer));
  return *timers_.back();
}

void LoopThread::quit() {
  if (quit_) return;
  quit_ = true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    accepting_ = false;
    wake_closed_ = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&wake_), nullptr);
  }
  for (auto& t : timers_) {
    if (t->closed_) continue;
    t->closed_ = true;
    uv_timer_stop(&t->handle_);
    uv_close(reinterpret_cast<uv_handle_t*>(&t->handle_), nullptr);
  }
}

void LoopThread::run_posted() {
  // Taken in one batch: a function that posts again runs on the next wake-up, not in this turn.
  std::deque<std::function<void()>> batch;
  bool stop_requested = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    batch.swap(posted_);
    stop_requested = stop_requested_;
  }
  for (auto& fn : batch) run_guarded(component_, "posted", fn);
  if (!stop_requested || stopping_) return;
  stopping_ = true;
  if (on_stop_) {
    run_guarded(component_, "stop", on_stop_);
  } else {
    quit();
  }
}

void LoopThread::on_wake(uv_async_t* handle) {
  auto* self = static_cast<LoopThread*>(handle->data);
  if (!self->quit_) self->run_posted();
}

void LoopThread::on_timer(uv_timer_t* handle) {
  auto* timer = static_cast<Timer*>(handle->data);
  run_guarded(timer->owner_->component_, timer->what_, timer->fn_);
}

void LoopThread::Timer::start(std::chrono::milliseconds delay, std::chrono::milliseconds repeat) {
  if (closed_) return;
  uv_timer_start(&handle_, &LoopThread::on_timer, static_cast<uint64_t>(delay.count()),
                 static_cast<uint64_t>(repeat.count()));
}

void LoopThread::Timer::stop() {
  if (!closed_) uv_timer_stop(&handle_);
}

}  // namespace pdr::discovery::sources
