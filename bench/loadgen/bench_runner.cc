#include "bench/loadgen/bench_runner.h"

#include <uv.h>

#include <csignal>
#include <deque>
#include <memory>
#include <unordered_map>

#include <fmt/format.h>

#include "bench/loadgen/cache_workloads.h"
#include "bench/loadgen/trace_workload.h"

namespace pdr::loadgen {
namespace {

using Clock = std::chrono::steady_clock;

std::string failure_text(const Status& error, http::UpstreamFailure failure) {
  switch (failure) {
    case http::UpstreamFailure::kConnect: return "connect failed: " + error.message();
    case http::UpstreamFailure::kConnectTimeout: return "connect timed out";
    case http::UpstreamFailure::kFirstByteTimeout: return "no answer within the timeout";
    case http::UpstreamFailure::kIdleTimeout: return "stream stalled longer than the timeout";
    case http::UpstreamFailure::kConnectionLost: return "connection lost before the answer ended";
    case http::UpstreamFailure::kBadResponse: return "malformed HTTP response: " + error.message();
    default: return error.to_string();
  }
}

// The state of one run. Lives on the caller's stack; every handle is closed and the loop run
// dry before it goes.
class Run {
 public:
  Run(const std::vector<proto::HostPort>& targets, const EndpointOptions& endpoint,
      const std::vector<BenchRequest>& requests, const ScheduleOptions& schedule,
      const ProgressOptions& progress)
      : targets_(targets), endpoint_(endpoint), requests_(requests), schedule_(schedule),
        progress_(progress),
        offsets_(schedule.arrival_offsets.size() == requests.size()
                     ? schedule.arrival_offsets
                     : arrival_offsets(static_cast<uint32_t>(requests.size()),
                                       schedule.request_rate, schedule.burstiness, schedule.seed)),
        oracle_(schedule.oracle_block_tokens),
        slots_(requests.size()), has_next_turn_(requests.size(), false) {
    for (const BenchRequest& r : requests) {
      if (r.previous_turn && *r.previous_turn < requests.size()) {
        has_next_turn_[*r.previous_turn] = true;
      }
    }
    uv_loop_init(&loop_);
    pool_ = std::make_unique<http::UpstreamPool>(&loop_);
    for (uv_timer_t* t : {&arrival_timer_, &progress_timer_}) {
      uv_timer_init(&loop_, t);
      t->data = this;
    }
    for (uv_signal_t* s : {&sigint_, &sigterm_}) {
      uv_signal_init(&loop_, s);
      s->data = this;
    }
  }

  ~Run() {
    interrupted_ = true;  // a call the pool's shutdown might still end must not send another
    pool_.reset();
    for (uv_handle_t* h : handles()) {
      if (!uv_is_closing(h)) uv_close(h, nullptr);
    }
    while (uv_run(&loop_, UV_RUN_DEFAULT) != 0) {
    }
    uv_loop_close(&loop_);
  }

  RunOutcome go() {
    uv_signal_start(&sigint_, on_signal, SIGINT);
    uv_signal_start(&sigterm_, on_signal, SIGTERM);
    if (progress_.out != nullptr && progress_.interval.count() > 0) {
      const auto ms = static_cast<uint64_t>(progress_.interval.count());
      uv_timer_start(&progress_timer_, on_progress, ms, ms);
    }
    start_ = last_end_ = Clock::now();
    send_due();
    if (!finished()) uv_run(&loop_, UV_RUN_DEFAULT);
    if (progress_.out != nullptr) print_progress(true);

    RunOutcome outcome;
    outcome.duration_s = seconds_since_start(last_end_);
    outcome.max_in_flight = max_in_flight_;
    outcome.interrupted = interrupted_;
    outcome.oracle_prompt_tokens = oracle_.prompt_tokens();
    outcome.oracle_hit_tokens = oracle_.hit_tokens();
    outcome.max_send_lag_s = max_send_lag_s_;
    outcome.mean_send_lag_s = sent_ == 0 ? 0.0 : total_send_lag_s_ / sent_;
    for (Slot& slot : slots_) {
      if (slot.measurement) outcome.results.push_back(slot.measurement->take_result());
    }
    return outcome;
  }

 private:
  struct Slot {
    std::unique_ptr<StreamMeasurement> measurement;
    std::shared_ptr<http::UpstreamCall> call;
    bool done = false;
    // A conversation's turn: the request as sent (prompt composed with the earlier turns), and
    // the answer it got, both kept until the next turn is composed from them.
    std::optional<BenchRequest> composed;
    std::string answer;
  };

  const BenchRequest& as_sent(size_t index) const {
    return slots_[index].composed ? *slots_[index].composed : requests_[index];
  }

  std::vector<uv_handle_t*> handles() {
    return {reinterpret_cast<uv_handle_t*>(&arrival_timer_),
            reinterpret_cast<uv_handle_t*>(&progress_timer_),
            reinterpret_cast<uv_handle_t*>(&sigint_), reinterpret_cast<uv_handle_t*>(&sigterm_)};
  }

  double seconds_since_start(Clock::time_point t) const {
    return std::chrono::duration<double>(t - start_).count();
  }
  double now_s() const { return seconds_since_start(Clock::now()); }

  bool finished() const {
    return done_ == sent_ &&
           (interrupted_ || (next_ == requests_.size() && waiting_.empty() && blocked_.empty()));
  }

  // Queues every request whose arrival time has come, sends what the concurrency cap allows and
  // arms the timer for the next arrival.
  void send_due() {
    const double now = now_s();
    while (next_ < requests_.size() && offsets_[next_] <= now && !interrupted_) {
      const std::optional<uint32_t> previous = requests_[next_].previous_turn;
      if (previous && *previous < slots_.size() && !slots_[*previous].done) {
        blocked_[*previous] = next_++;  // sent when the previous turn answers
      } else {
        waiting_.push_back(next_++);
      }
    }
    while (!waiting_.empty() && !interrupted_ &&
           (!schedule_.max_concurrency || in_flight_ < *schedule_.max_concurrency)) {
      send(waiting_.front());
      waiting_.pop_front();
    }
    if (next_ < requests_.size() && !interrupted_) {
      const double wait_s = std::max(0.0, offsets_[next_] - now_s());
      uv_timer_start(&arrival_timer_, on_arrival, static_cast<uint64_t>(wait_s * 1e3), 0);
    }
    if (finished()) stop();
  }

  void send(size_t index) {
    Slot& slot = slots_[index];
    if (const std::optional<uint32_t> previous = requests_[index].previous_turn;
        previous && *previous < slots_.size()) {
      Slot& earlier = slots_[*previous];
      slot.composed = compose_turn(as_sent(*previous), earlier.answer, requests_[index],
                                   schedule_.format, endpoint_.chat, schedule_.vocab_size);
      earlier.composed.reset();  // only the latest turn of a conversation is kept
      earlier.answer.clear();
      earlier.answer.shrink_to_fit();
    }
    const bool trace_prompt = !requests_[index].block_seeds.empty();
    if (trace_prompt) {
      // Built now, dropped once the call holds its body: a trace's prompts are never all in
      // memory at once.
      const std::vector<uint32_t> ids = trace_prompt_ids(requests_[index], schedule_.vocab_size);
      slot.composed = requests_[index];
      slot.composed->block_seeds.clear();
      slot.composed->prompt_json = token_ids_json(ids);
      oracle_.add(std::vector<uint64_t>(ids.begin(), ids.end()));
    } else {
      oracle_.add(prompt_token_keys(as_sent(index), schedule_.format));
    }
    const BenchRequest& request = as_sent(index);
    const double now = now_s();
    const double lag = std::max(0.0, now - offsets_[index]);
    max_send_lag_s_ = std::max(max_send_lag_s_, lag);
    total_send_lag_s_ += lag;
    slot.measurement = std::make_unique<StreamMeasurement>(request, now, has_next_turn_[index],
                                                           endpoint_.generate);
    ++sent_;
    ++in_flight_;
    max_in_flight_ = std::max(max_in_flight_, in_flight_);
    StreamMeasurement* m = slot.measurement.get();
    http::UpstreamCallbacks callbacks;
    callbacks.on_head = [m](int status, const std::vector<http::Header>& headers) {
      m->on_head(status, headers);
    };
    callbacks.on_body = [this, m, index](std::string_view bytes) {
      m->on_body(bytes, now_s());
      // A failed stream stops here: reading the rest measures nothing.
      if (m->failed_early()) finish(index, "stream failed");
    };
    callbacks.on_complete = [this, m, index] {
      m->on_complete(now_s());
      finish(index, nullptr);
    };
    callbacks.on_error = [this, m, index](const Status& error) {
      const http::UpstreamCall* call = slots_[index].call.get();
      m->on_error(failure_text(error, call ? call->failure() : http::UpstreamFailure::kNone),
                  now_s());
      finish(index, nullptr);
    };
    slot.call = pool_->start(targets_[index % targets_.size()], build_request(endpoint_, request),
                             schedule_.timeouts, std::move(callbacks));
    if (trace_prompt) slot.composed.reset();
  }

  // cancel_reason: close the call (the server sees the close and aborts the request) and fail
  // the measurement with this reason unless it already failed; nullptr: the call ended itself.
  void finish(size_t index, const char* cancel_reason) {
    Slot& slot = slots_[index];
    if (!slot.call) return;  // already finished
    std::shared_ptr<http::UpstreamCall> call = std::move(slot.call);
    if (cancel_reason != nullptr) {
      slot.measurement->on_error(cancel_reason, now_s());
      call->cancel();
    }
    last_end_ = Clock::now();
    --in_flight_;
    ++done_;
    slot.done = true;
    if (has_next_turn_[index]) slot.answer = slot.measurement->answer();
    if (const auto next = blocked_.find(index); next != blocked_.end()) {
      waiting_.push_back(next->second);
      blocked_.erase(next);
    }
    send_due();
  }

  void interrupt() {
    if (interrupted_) return;
    interrupted_ = true;
    uv_timer_stop(&arrival_timer_);
    waiting_.clear();
    blocked_.clear();
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].call) finish(i, "interrupted");
    }
    if (finished()) stop();
  }

  void stop() {
    uv_timer_stop(&arrival_timer_);
    uv_timer_stop(&progress_timer_);
    uv_signal_stop(&sigint_);
    uv_signal_stop(&sigterm_);
    uv_stop(&loop_);
  }

  void print_progress(bool last) {
    const uint32_t failed = failed_so_far();
    const std::string line =
        fmt::format("pdrouter-bench: {}/{} done, {} failed, {} in flight, {:.1f} s{}", done_,
                    requests_.size(), failed, in_flight_, now_s(),
                    interrupted_ ? " (interrupted)" : "");
    if (progress_.overwrite) {
      fmt::print(progress_.out, "\r{}\x1b[K{}", line, last ? "\n" : "");
    } else {
      fmt::print(progress_.out, "{}\n", line);
    }
    std::fflush(progress_.out);
  }

  uint32_t failed_so_far() const {
    uint32_t failed = 0;
    for (const Slot& slot : slots_) {
      if (slot.measurement && !slot.call && !slot.measurement->result().success) ++failed;
    }
    return failed;
  }

  static void on_arrival(uv_timer_t* t) { static_cast<Run*>(t->data)->send_due(); }
  static void on_progress(uv_timer_t* t) { static_cast<Run*>(t->data)->print_progress(false); }
  static void on_signal(uv_signal_t* s, int) { static_cast<Run*>(s->data)->interrupt(); }

  const std::vector<proto::HostPort>& targets_;
  const EndpointOptions& endpoint_;
  const std::vector<BenchRequest>& requests_;
  const ScheduleOptions& schedule_;
  const ProgressOptions& progress_;
  const std::vector<double> offsets_;

  uv_loop_t loop_;
  std::unique_ptr<http::UpstreamPool> pool_;
  uv_timer_t arrival_timer_;
  uv_timer_t progress_timer_;
  uv_signal_t sigint_;
  uv_signal_t sigterm_;

  PrefixOracle oracle_;
  std::vector<Slot> slots_;
  std::vector<bool> has_next_turn_;  // a later turn is composed from this request's answer
  std::deque<size_t> waiting_;  // arrived, held back by the concurrency cap
  std::unordered_map<size_t, size_t> blocked_;  // previous turn -> its next turn, arrived
  size_t next_ = 0;             // next request to arrive
  uint32_t sent_ = 0, done_ = 0, in_flight_ = 0, max_in_flight_ = 0;
  bool interrupted_ = false;
  double max_send_lag_s_ = 0, total_send_lag_s_ = 0;
  Clock::time_point start_, last_end_;
};

}  // namespace

RunOutcome run_benchmark(const std::vector<proto::HostPort>& targets, const EndpointOptions& endpoint,
                         const std::vector<BenchRequest>& requests, const ScheduleOptions& schedule,
                         const ProgressOptions& progress) {
  Run run(targets, endpoint, requests, schedule, progress);
  return run.go();
}

FetchResult fetch(const proto::HostPort& target, http::UpstreamRequest request,
                  const http::UpstreamTimeouts& timeouts, size_t max_body) {
  FetchResult result;
  uv_loop_t loop;
  uv_loop_init(&loop);
  {
    http::UpstreamPool pool(&loop);
    http::UpstreamCallbacks callbacks;
    bool too_large = false;
    callbacks.on_head = [&](int status, const std::vector<http::Header>&) {
      result.http_status = status;
    };
    callbacks.on_body = [&](std::string_view bytes) {
      if (result.body.size() + bytes.size() > max_body) too_large = true;
      if (!too_large) result.body.append(bytes);
    };
    callbacks.on_complete = [&] {
      uv_stop(&loop);
      if (too_large) {
        result.error = {StatusCode::kTooLarge, fmt::format("answer larger than {} bytes", max_body)};
      }
    };
    std::shared_ptr<http::UpstreamCall> call;
    callbacks.on_error = [&](const Status& error) {
      uv_stop(&loop);
      result.error = {error.code(), failure_text(error, call ? call->failure()
                                                             : http::UpstreamFailure::kNone)};
    };
    call = pool.start(target, std::move(request), timeouts, std::move(callbacks));
    uv_run(&loop, UV_RUN_DEFAULT);
  }
  while (uv_run(&loop, UV_RUN_DEFAULT) != 0) {
  }
  uv_loop_close(&loop);
  return result;
}

}  // namespace pdr::loadgen
