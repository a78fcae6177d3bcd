#include "tests/support/transfer/faulty_backend.h"

#include <atomic>
#include <charconv>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace pdr::transfer {

namespace {

// The inner backend works on a shadow of the engine's task, so the wrapper sees its finish() first
// (to corrupt data, to count) and then finishes the engine's task.
struct Shadow {
  XferTask* outer = nullptr;
  std::unique_ptr<XferTask> inner;
  bool corrupt = false;
  bool restore_write = false;  // WRITE corruption: the flipped source byte to restore
  std::byte* flipped = nullptr;
  bool submitted = false;       // inner_->submit() returned: cancels go to the inner backend
  bool cancel_pending = false;  // a cancel came before that: forward() passes it on
};

void flip(std::byte* byte) { *byte ^= std::byte{0xff}; }

class FaultyBackend final : public Backend {
 public:
  FaultyBackend(std::unique_ptr<Backend> inner, const FaultPlan& plan)
      : inner_(std::move(inner)), plan_(plan) {}
  ~FaultyBackend() override { stop(); }

  BackendKind kind() const override { return inner_->kind(); }
  Status start(const BackendContext& context) override {
    if (Status s = inner_->start(context); !s) return s;
    timer_ = std::thread([this] { run_timer(); });
    return Status::ok();
  }
  void stop() override {
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    cv_.notify_all();
    if (timer_.joinable()) timer_.join();
    // Delayed transfers never reached the inner backend: finish them here.
    std::multimap<std::chrono::steady_clock::time_point, XferTask*> delayed;
    {
      std::lock_guard lock(mu_);
      delayed.swap(delayed_);
    }
    for (auto& [when, task] : delayed) task->finish({XferState::kFailed, XferCause::kPeerGone, 0});
    inner_->stop();
  }
  std::string local_address() const override { return inner_->local_address(); }
  Status on_region_registered(RegionId id, const Region& region) override {
    return inner_->on_region_registered(id, region);
  }
  void on_region_unregistered(RegionId id) override { inner_->on_region_unregistered(id); }
  std::string region_keys(RegionId id) const override { return inner_->region_keys(id); }
  bool can_reach(const proto::TransferDescriptor& local,
                 const proto::TransferDescriptor& peer) const override {
    return inner_->can_reach(local, peer);
  }
  Status add_peer(PeerId peer, const proto::TransferDescriptor& d) override {
    return inner_->add_peer(peer, d);
  }
  void remove_peer(PeerId peer) override { inner_->remove_peer(peer); }

  Status submit(XferTask* task) override {
    const std::uint64_t n = ++submitted_;
    if (plan_.fail_every != 0 && n % plan_.fail_every == 0) {
      task->finish({XferState::kFailed, plan_.fail_cause, 0});
      return Status::ok();
    }
    if (plan_.latency.count() > 0) {
      {
        std::lock_guard lock(mu_);
        if (stopped_) return Status(StatusCode::kIoError, "backend stopped");
        delayed_.emplace(std::chrono::steady_clock::now() + plan_.latency, task);
      }
      cv_.notify_all();
      return Status::ok();
    }
    return forward(task);
  }

  void cancel(std::uint64_t id) override {
    {
      std::lock_guard lock(mu_);
      auto it = shadows_.find(id);
      if (it == shadows_.end()) {
        // Still delayed: the timer thread finishes it with its cancel cause.
        cv_.notify_all();
        return;
      }
      Shadow& shadow = *it->second;
      shadow.inner->request_cancel(shadow.outer->cancel_cause());
      if (!shadow.submitted) {
        // The inner backend does not know the id yet and would drop the cancel.
        shadow.cancel_pending = true;
        return;
      }
    }
    inner_->cancel(id);
  }

 private:
  Status forward(XferTask* outer) {
    auto shadow = std::make_unique<Shadow>();
    shadow->outer = outer;
    shadow->inner = std::make_unique<XferTask>(outer->id(), outer->op(), outer->peer(),
                                               &FaultyBackend::on_inner_finish, this);
    shadow->inner->mutable_segments() =
        std::vector<XferSegment>(outer->segments().begin(), outer->segments().end());
    shadow->inner->set_total_bytes(outer->total_bytes());
    shadow->inner->set_notify(outer->notify());
    const std::uint64_t n = ++forwarded_;
    shadow->corrupt = plan_.corrupt_every != 0 && n % plan_.corrupt_every == 0 &&
                      outer->total_bytes() > 0;
    if (shadow->corrupt && outer->op() == XferOp::kWrite) {
      shadow->flipped = first_byte(*outer);
      flip(shadow->flipped);
      shadow->restore_write = true;
    }
    XferTask* inner = shadow->inner.get();
    const std::uint64_t id = outer->id();
    XferCause cancelled = XferCause::kNone;
    {
      // The engine marks the task before it calls cancel(), which takes mu_: a cancel that came
      // while the task was between the delay queue and this map shows here; a later one finds the
      // shadow and is left pending until the inner backend knows the id.
      std::lock_guard lock(mu_);
      shadows_[id] = std::move(shadow);
      cancelled = outer->cancel_cause();
    }
    if (cancelled != XferCause::kNone) inner->request_cancel(cancelled);
    Status s = inner_->submit(inner);
    if (s) {
      bool cancel_now = cancelled != XferCause::kNone;
      {
        std::lock_guard lock(mu_);
        if (auto it = shadows_.find(id); it != shadows_.end()) {  // else: already finished
          it->second->submitted = true;
          cancel_now = cancel_now || it->second->cancel_pending;
        } else {
          cancel_now = false;
        }
      }
      if (cancel_now) inner_->cancel(id);
    }
    if (!s) {
      std::unique_ptr<Shadow> undo;
      {
        std::lock_guard lock(mu_);
        auto it = shadows_.find(id);
        undo = std::move(it->second);
        shadows_.erase(it);
      }
      if (undo->restore_write) flip(undo->flipped);
    }
    return s;
  }

  static std::byte* first_byte(const XferTask& task) {
    for (const XferSegment& segment : task.segments()) {
      if (segment.length > 0) return segment.local_addr;
    }
    return nullptr;
  }

  static void on_inner_finish(void* owner, XferTask* inner, const XferResult& result) {
    auto* self = static_cast<FaultyBackend*>(owner);
    std::unique_ptr<Shadow> shadow;
    {
      std::lock_guard lock(self->mu_);
      auto it = self->shadows_.find(inner->id());
      if (it == self->shadows_.end()) return;
      shadow = std::move(it->second);
      self->shadows_.erase(it);
    }
    if (shadow->restore_write) flip(shadow->flipped);
    if (shadow->corrupt && shadow->outer->op() == XferOp::kRead &&
        result.state == XferState::kDone) {
      flip(first_byte(*shadow->outer));
    }
    shadow->outer->finish(result);
  }

  void run_timer() {
    std::unique_lock lock(mu_);
    while (!stopped_) {
      // Cancelled delayed transfers finish at once.
      for (auto it = delayed_.begin(); it != delayed_.end();) {
        if (it->second->cancel_cause() == XferCause::kNone) {
          ++it;
          continue;
        }
        XferTask* task = it->second;
        it = delayed_.erase(it);
        lock.unlock();
        const XferCause cause = task->cancel_cause();
        task->finish({cause == XferCause::kTimeout ? XferState::kFailed : XferState::kCancelled,
                      cause, 0});
        lock.lock();
      }
      // The scan above lets go of the lock to finish a cancelled task: a stop() that came then
      // set stopped_ and notified nobody, so it is looked at again before any wait.
      if (stopped_) break;
      if (delayed_.empty()) {
        cv_.wait(lock);
        continue;
      }
      auto first = delayed_.begin();
      if (std::chrono::steady_clock::now() < first->first) {
        cv_.wait_until(lock, first->first);
        continue;
      }
      XferTask* task = first->second;
      delayed_.erase(first);
      lock.unlock();
      if (Status s = forward(task); !s) {
        task->finish({XferState::kFailed, XferCause::kInternal, 0});
      }
      lock.lock();
    }
  }

  std::unique_ptr<Backend> inner_;
  const FaultPlan plan_;
  std::atomic<std::uint64_t> submitted_{0};
  std::atomic<std::uint64_t> forwarded_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  std::multimap<std::chrono::steady_clock::time_point, XferTask*> delayed_;
  std::unordered_map<std::uint64_t, std::unique_ptr<Shadow>> shadows_;
  std::thread timer_;
};

bool parse_u64(std::string_view text, std::uint64_t* out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size() && !text.empty();
}

}  // namespace

Status parse_fault_plan(std::string_view text, FaultPlan* out) {
  FaultPlan plan;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    const std::size_t eq = item.find('=');
    const std::string_view key = item.substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? "" : item.substr(eq + 1);
    std::uint64_t number = 0;
    auto bad = [&] {
      return Status(StatusCode::kInvalidValue, "fault '" + std::string(item) +
                                                   "' is not latency_us=N, fail_every=N, "
                                                   "fail_cause=peer_gone|access|internal or "
                                                   "corrupt_every=N");
    };
    if (key == "fail_cause") {
      if (value == "peer_gone") plan.fail_cause = XferCause::kPeerGone;
      else if (value == "access") plan.fail_cause = XferCause::kAccess;
      else if (value == "internal") plan.fail_cause = XferCause::kInternal;
      else return bad();
      continue;
    }
    if (!parse_u64(value, &number) || number > UINT32_MAX) return bad();
    if (key == "latency_us") plan.latency = std::chrono::microseconds(number);
    else if (key == "fail_every") plan.fail_every = static_cast<std::uint32_t>(number);
    else if (key == "corrupt_every") plan.corrupt_every = static_cast<std::uint32_t>(number);
    else return bad();
  }
  *out = plan;
  return Status::ok();
}

std::unique_ptr<Backend> make_faulty_backend(std::unique_ptr<Backend> inner, const FaultPlan& plan) {
  return std::make_unique<FaultyBackend>(std::move(inner), plan);
}

}  // namespace pdr::transfer
