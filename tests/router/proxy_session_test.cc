// ProxySession's state machine (router/proxy/proxy_session.h) driven event by event: every state
// a request rests in, crossed with every event that can reach it there, in a serial dialect (NIXL)
// and a concurrent one (MoRIIO WRITE).
//
// The client side is real: an http::Server with one worker on 127.0.0.1 and a blocking client
// socket. The upstream side is a FakeUpstream (router/proxy/upstream_port.h) injected into the
// worker's WorkerContext: it records every leg the session starts and the test answers, fails or
// leaves each one from the test thread by posting onto the worker loop. Timeouts are the session's
// real libuv timers with short values from the topology. Waits are for a condition (re-checked on
// the worker whenever the fake reports a change) or a deadline, never sleeps.
//
// PAIRED and PREFILL_DONE are entered and left within one callback (build_and_send, and the
// prefill's on_complete), so no event can reach a request there; the cases check that the
// transitions through them are counted. A concurrent dialect leaves PREFILL_SENT the same way
// (both legs are sent at once).
//
// Further below: orphaned concurrent prefills, back-pressure and a client that reads nothing,
// buffered JSON answers, Mooncake's bootstrap step (a request resting in ACCEPTED), a drain the
// request fits in, and NIXL's no-KV fallback.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "discovery/config/topology.h"
#include "discovery/instance.h"
#include "discovery/load_charge.h"
#include "proto/base/snapshot_cell.h"
#include "router/http/http_server.h"
#include "router/http/http_worker.h"
#include "router/proxy/proxy_session.h"
#include "router/proxy/proxy_shared.h"
#include "router/proxy/upstream_port.h"
#include "tests/support/http_client.h"
#include "tests/support/time_scale.h"

namespace pdr::router::proxy {
namespace {

using namespace std::chrono_literals;
using discovery::Instance;
using http::UpstreamFailure;
using proto::Connector;
using proto::Role;
using proto::TransferMode;

constexpr uint16_t kPrefillPort = 8100;

// A test bound scaled by PDR_TIME_SCALE, in the milliseconds the clients take.
std::chrono::milliseconds scaled_ms(std::chrono::milliseconds bound) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(test::scaled(bound));
}
constexpr uint16_t kDecodePort = 8200;

class FakeUpstream;

// One upstream call the session started. Worker thread only (the test reaches it by posting).
class FakeCall final : public UpstreamPort::Call {
 public:
  enum class End { kOpen, kCompleted, kFailed, kCancelled, kPoolClosed };

  FakeCall(FakeUpstream& owner, proto::HostPort target, http::UpstreamRequest request,
           http::UpstreamCallbacks callbacks)
      : owner_(owner), target(std::move(target)), request(std::move(request)), cb_(std::move(callbacks)) {}

 private:
  FakeUpstream& owner_;

 public:

  // UpstreamPort::Call, called by the session.
  void cancel() override;
  void pause() override;
  void resume() override;
  UpstreamFailure failure() const override { return failure_; }
  bool reused_connection() const override { return false; }

  // Driven by the test (as the upstream would).
  // Each runs from a copy of all four callbacks: a cancel() inside releases none of them while
  // it runs (UpstreamPort's contract).
  void head(int status, std::vector<http::Header> headers) {
    if (!open()) return;
    const http::UpstreamCallbacks cb = cb_;
    cb.on_head(status, headers);
  }
  void body(std::string_view chunk) {
    if (!open()) return;
    const http::UpstreamCallbacks cb = cb_;
    cb.on_body(chunk);
  }
  void complete();
  void fail(UpstreamFailure failure, std::string message, End how = End::kFailed);
  // A whole answer: head, body, completion.
  void answer(int status, std::string_view content_type, std::string_view body_bytes) {
    head(status, {{"Content-Type", std::string(content_type)}});
    body(body_bytes);
    complete();
  }

  bool open() const { return end == End::kOpen; }
  bool prefill() const { return target.port == kPrefillPort; }
  bool bootstrap_query() const { return request.path == "/query"; }
  std::string request_id() const {
    for (const auto& h : request.headers) {
      if (h.name == "X-Request-Id") return h.value;
    }
    return {};
  }

  const proto::HostPort target;
  const http::UpstreamRequest request;
  End end = End::kOpen;
  // pause() / resume() that changed something (both are idempotent, as http::UpstreamCall's).
  bool paused = false;
  int pauses = 0, resumes = 0;

 private:
  void ended(End how);

  UpstreamFailure failure_ = UpstreamFailure::kNone;
  http::UpstreamCallbacks cb_;
};

// The injected UpstreamPort. Calls live on the worker thread; `generation` (under the mutex)
// tells a waiting test thread that something changed.
class FakeUpstream final : public UpstreamPort {
 public:
  CallPtr start(const proto::HostPort& target, http::UpstreamRequest&& request, http::UpstreamTimeouts,
                http::UpstreamCallbacks&& callbacks) override {
    // A leg's body is rendered only inside start() (UpstreamRequest::append_body points at the
    // session's unrendered leg): render it now, as the real client renders it into its wire
    // buffer, and check the announced size.
    if (request.append_body) {
      request.append_body(&request.body);
      EXPECT_EQ(request.body.size(), request.body_size) << "append_body wrote a different size";
      request.append_body = nullptr;
    }
    // Borrowed headers too are read only inside start(): copied, as the real client copies them.
    for (const auto& [name, value] : request.borrowed_headers) request.headers.push_back(http::Header{name, value});
    request.borrowed_headers = {};
    auto call = std::make_shared<FakeCall>(*this, target, std::move(request), std::move(callbacks));
    calls.push_back(call);
    changed();
    return call;
  }
  void close_all() override {
    ++close_alls;
    for (auto& c : std::vector<std::shared_ptr<FakeCall>>(calls)) {
      if (c->open()) c->fail(UpstreamFailure::kPoolClosed, "pool closed", FakeCall::End::kPoolClosed);
    }
  }

  void changed() {
    std::lock_guard<std::mutex> lock(mu_);
    ++generation_;
    cv_.notify_all();
  }
  uint64_t generation() {
    std::lock_guard<std::mutex> lock(mu_);
    return generation_;
  }
  // Until the generation moves past `seen` or `at_most` passes.
  void wait_change(uint64_t seen, std::chrono::milliseconds at_most) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, at_most, [&] { return generation_ != seen; });
  }

  // Worker thread (or the test thread once the server stopped).
  std::vector<std::shared_ptr<FakeCall>> calls;
  int close_alls = 0;

  std::vector<std::shared_ptr<FakeCall>> of(bool prefill) const {
    std::vector<std::shared_ptr<FakeCall>> out;
    for (const auto& c : calls) {
      if (c->prefill() == prefill) out.push_back(c);
    }
    return out;
  }
  size_t open_calls() const {
    size_t n = 0;
    for (const auto& c : calls) n += c->open() ? 1 : 0;
    return n;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;
};

void FakeCall::ended(End how) {
  end = how;
  owner_.changed();
}

void FakeCall::cancel() {
  if (!open()) return;  // a no-op once done, as http::UpstreamCall::cancel
  ended(End::kCancelled);
  cb_ = {};
}

void FakeCall::pause() {
  if (paused || !open()) return;
  paused = true;
  ++pauses;
  owner_.changed();
}

void FakeCall::resume() {
  if (!paused) return;  // the session's drain callback stays installed: it may resume unpaused
  paused = false;
  ++resumes;
  owner_.changed();
}

// The callbacks are released together, after the last one returned (UpstreamPort's contract).
void FakeCall::complete() {
  if (!open()) return;
  const http::UpstreamCallbacks cb = std::move(cb_);
  cb_ = {};
  ended(End::kCompleted);
  cb.on_complete();
}

void FakeCall::fail(UpstreamFailure failure, std::string message, End how) {
  if (!open()) return;
  failure_ = failure;
  const http::UpstreamCallbacks cb = std::move(cb_);
  cb_ = {};
  ended(how);
  cb.on_error(Status(StatusCode::kIoError, message));
}

// ---------------------------------------------------------------------------------------------

enum class Dialect { kNixl, kMoriioWrite, kMooncake };

std::shared_ptr<const Instance> node(std::string host, Role role, Dialect dialect) {
  auto i = std::make_shared<Instance>();
  const uint16_t port = role == Role::kPrefill ? kPrefillPort : kDecodePort;
  i->http_address = proto::HostPort{host, port};
  i->key = i->http_address.to_string();
  i->role = role;
  if (dialect == Dialect::kNixl) {
    i->connector = Connector::kNixl;
  } else if (dialect == Dialect::kMooncake) {
    i->connector = Connector::kMooncake;  // bootstrap /query on the topology's port (8998)
  } else {
    i->connector = Connector::kMoriio;
    i->transfer_mode = TransferMode::kWrite;
    i->zmq_address = "host:" + host + ",handshake:6301,notify:61005";
  }
  return i;
}

constexpr std::string_view kStreamBody = R"({"model":"m","prompt":"hello","max_tokens":8,"stream":true})";
constexpr std::string_view kNixlPrefillAnswer =
    R"({"id":"cmpl-1","choices":[{"text":"x"}],"kv_transfer_params":{"do_remote_prefill":true,)"
    R"("do_remote_decode":false,"remote_block_ids":[1,2],"remote_engine_id":"e1",)"
    R"("remote_host":"127.0.0.1","remote_port":5600,"tp_size":1}})";
constexpr std::string_view kFirstEvent = "data: {\"choices\":[{\"text\":\"A\"}]}\n\n";
constexpr std::string_view kLastEvent = "data: {\"choices\":[{\"text\":\"B\"}]}\n\ndata: [DONE]\n\n";

// One router worker with the fake upstream, a topology and a registry of two prefills and two
// decodes of one dialect.
class Harness {
 public:
  explicit Harness(Dialect dialect, const std::function<void(config::Topology&)>& tweak = {}) {
    auto topology = std::make_shared<config::Topology>();
    topology->timeouts.connect = 1000ms;
    topology->timeouts.prefill = scaled_ms(20s);
    topology->timeouts.first_byte = scaled_ms(20s);
    topology->timeouts.stream_idle = scaled_ms(20s);
    topology->timeouts.client_write = scaled_ms(20s);
    topology->retries.prefill_attempts = 2;
    topology->retries.decode_attempts = 2;
    if (tweak) tweak(*topology);
    topology_cell_.publish(topology);
    auto snapshot = std::make_shared<discovery::RegistrySnapshot>();
    snapshot->instances = {node("127.0.0.1", Role::kPrefill, dialect), node("127.0.0.2", Role::kPrefill, dialect),
                           node("127.0.0.3", Role::kDecode, dialect), node("127.0.0.4", Role::kDecode, dialect)};
    registry_cell_.publish(snapshot);
    nodes_ = snapshot->instances;
    shared_.registry = &registry_cell_;
    shared_.topology = &topology_cell_;

    http::ServerOptions options;
    options.host = "127.0.0.1";
    options.workers = 1;
    options.on_worker_stop = [this](uint32_t) { context_.reset(); };
    Status st = server_.start(options, [this](http::Request&& request, http::ResponseWriter writer) {
      admit(std::move(request), std::move(writer));
    });
    EXPECT_TRUE(st.is_ok()) << st.message();
  }

  ~Harness() { server_.stop(0ms); }

  // The admission ProxyService::admit does before a session starts: in_flight and the body's
  // share of the buffered-bytes budget (the session gives both back).
  void admit(http::Request&& request, http::ResponseWriter writer) {
    if (!context_) context_ = std::make_unique<WorkerContext>(shared_, 0, server_.loop(0), &fake);
    ProxyCounters& c = shared_.counters;
    c.in_flight.fetch_add(1, std::memory_order_relaxed);
    EXPECT_TRUE(c.buffered.reserve(request.body.size(), 0));
    AdmittedRequest admitted;
    admitted.budget_bytes = request.body.size();
    admitted.path = std::move(request.path);
    admitted.body = std::move(request.body);
    ProxySession::start(*context_, std::move(admitted), std::move(writer));
  }

  // Runs `fn` on the worker and waits for it; false (and a failure) past the deadline.
  bool on_worker(std::function<void()> fn) {
    auto done = std::make_shared<std::promise<void>>();
    auto future = done->get_future();
    server_.post(0, [fn = std::move(fn), done] {
      fn();
      done->set_value();
    });
    if (future.wait_for(test::scaled(10s)) != std::future_status::ready) {
      ADD_FAILURE() << "the worker did not run a posted task within 10 s";
      return false;
    }
    return true;
  }

  // Until `pred` (evaluated on the worker) holds, or a deadline. Re-checked whenever the fake
  // reports a change, and at least every 20 ms for changes the fake does not see.
  bool wait_until(const std::function<bool()>& pred, std::string_view what,
                  std::chrono::milliseconds bound = 10000ms) {
    const auto deadline = std::chrono::steady_clock::now() + test::scaled(bound);
    while (true) {
      const uint64_t seen = fake.generation();
      bool holds = false;
      if (!on_worker([&] { holds = pred(); })) return false;
      if (holds) return true;
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "timed out waiting for " << what;
        return false;
      }
      fake.wait_change(seen, 20ms);
    }
  }

  // The session ended (in_flight back to 0; end() is the last thing a session's callback does,
  // and the check runs on the worker after that callback returned).
  bool wait_ended() {
    return wait_until([this] { return shared_.counters.in_flight.load() == 0; }, "the session to end");
  }

  std::string connect_and_send(std::string_view body = kStreamBody) {
    std::string err = client.connect("127.0.0.1", server_.port());
    if (!err.empty()) return err;
    return client.send_request("POST", "/v1/completions", {{"Content-Type", "application/json"}}, body);
  }

  // Stops the server: in-flight requests get `drain`, then their connections are closed and the
  // worker's context (and so the upstream port) is destroyed. The fake is the test thread's after.
  void stop(std::chrono::milliseconds drain) { server_.stop(drain); }

  ProxyCounters& counters() { return shared_.counters; }
  uint16_t port() const { return server_.port(); }
  uint64_t transitions(RequestState from, RequestState to) {
    return shared_.counters.transitions[static_cast<size_t>(from)][static_cast<size_t>(to)].load();
  }
  uint64_t into(RequestState to) {
    uint64_t n = 0;
    for (size_t from = 0; from < kRequestStateCount; ++from) {
      n += shared_.counters.transitions[from][static_cast<size_t>(to)].load();
    }
    return n;
  }
  uint64_t failures(Leg leg, LegFailure f) {
    return shared_.counters.leg_failures[static_cast<size_t>(leg)][static_cast<size_t>(f)].load();
  }
  uint64_t retries(Leg leg) { return shared_.counters.retries[static_cast<size_t>(leg)].load(); }
  // The load ledger's figures (discovery/load_charge.h) summed over the nodes of `role`, and
  // the sum of every node's DP-rank slots (which must equal the nodes' totals).
  discovery::LoadFigures load(Role role, bool ranks = false) const {
    discovery::LoadFigures sum;
    for (const auto& n : nodes_) {
      if (n->role != role) continue;
      if (!ranks) {
        sum += discovery::node_load(*n->liveness);
        continue;
      }
      sum += n->liveness->ledger.beyond();
      for (uint32_t r = 0; r < n->liveness->ledger.rank_slots(); ++r) sum += n->liveness->ledger.rank(r);
    }
    return sum;
  }

  FakeUpstream fake;
  test::HttpClient client;

 private:
  SnapshotCell<discovery::RegistrySnapshot> registry_cell_;
  std::vector<std::shared_ptr<const discovery::Instance>> nodes_;
  SnapshotCell<config::Topology> topology_cell_;
  ProxyShared shared_;
  std::unique_ptr<WorkerContext> context_;  // worker thread only
  http::Server server_;
};

// ---------------------------------------------------------------------------------------------
// The state table.

enum class At {
  kPrefillSent,  // serial: the prefill leg is out, no answer yet
  kDecodeSent,   // the decode leg is out (concurrent: with the prefill), nothing answered
  kHeldHead,     // DECODE_SENT with the decode's event-stream head held back (no event yet)
  kStreaming,    // the head and a first event reached the client (concurrent: prefill still open)
};

enum class Event {
  kClientClose,
  kPrefillError,    // transport (connection lost)
  kPrefill5xx,
  kPrefill4xx,
  kPrefillTimeout,  // timeouts.prefill (the session's own timer)
  kDecodeRefused,   // transport: connect refused (the decode never got the request)
  kDecodeError,     // transport: connection lost (before or after the first byte, by state)
  kDecode5xx,
  kDecode4xx,
  kDecodeTimeout,   // first byte (transport), the held head's first event (session timer), or idle
  kDrain,           // router shutdown: the server drains, then closes what is left
  kRequestDeadline, // timeouts.request: the whole request took too long
};

enum class Then {
  kNothing,          // the request is over
  kNewPair,          // a new prefill and decode were sent: answer them, the client gets 200
  kDecodeOnly,       // only a new decode was sent (NIXL): answer it, the client gets 200
  kStreamContinues,  // the event changed nothing for the client: finish the decode, 200
};

struct Case {
  std::string name;
  Dialect dialect;
  At at;
  Event event;
  // Expectations.
  RequestState final_state;
  int status;             // what the client's response says; 0: none (it left or was cut off)
  std::string code;       // the error code in the JSON body or the stream's error event
  bool error_event;       // a 200 stream ending with an error event and data: [DONE]
  Then then;
  Leg retry_of = Leg::kPrefill;  // for kNewPair / kDecodeOnly
};

std::string dialect_name(Dialect d) { return d == Dialect::kNixl ? "Nixl" : "MoriioWrite"; }
std::string at_name(At at) {
  switch (at) {
    case At::kPrefillSent: return "PrefillSent";
    case At::kDecodeSent: return "DecodeSent";
    case At::kHeldHead: return "HeldHead";
    case At::kStreaming: return "Streaming";
  }
  return "?";
}
std::string event_name(Event e) {
  switch (e) {
    case Event::kClientClose: return "ClientClose";
    case Event::kPrefillError: return "PrefillError";
    case Event::kPrefill5xx: return "Prefill5xx";
    case Event::kPrefill4xx: return "Prefill4xx";
    case Event::kPrefillTimeout: return "PrefillTimeout";
    case Event::kDecodeRefused: return "DecodeRefused";
    case Event::kDecodeError: return "DecodeError";
    case Event::kDecode5xx: return "Decode5xx";
    case Event::kDecode4xx: return "Decode4xx";
    case Event::kDecodeTimeout: return "DecodeTimeout";
    case Event::kDrain: return "Drain";
    case Event::kRequestDeadline: return "RequestDeadline";
  }
  return "?";
}

using RS = RequestState;

Case make(Dialect d, At at, Event e, RS final_state, int status, std::string code, bool error_event, Then then,
          Leg retry_of = Leg::kPrefill) {
  return Case{dialect_name(d) + "_" + at_name(at) + "_" + event_name(e), d, at, e, final_state, status,
              std::move(code), error_event, then, retry_of};
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  // Every state of both dialects: the client leaving, and the router shutting down.
  for (Dialect d : {Dialect::kNixl, Dialect::kMoriioWrite}) {
    for (At at : {At::kPrefillSent, At::kDecodeSent, At::kHeldHead, At::kStreaming}) {
      if (d == Dialect::kMoriioWrite && at == At::kPrefillSent) continue;  // left at once
      out.push_back(make(d, at, Event::kClientClose, RS::kCancelled, 0, "", false, Then::kNothing));
      out.push_back(make(d, at, Event::kDrain, RS::kCancelled, 0, "", false, Then::kNothing));
      const bool streaming = at == At::kStreaming;
      out.push_back(make(d, at, Event::kRequestDeadline, RS::kFailed, streaming ? 200 : 504, "request_deadline",
                         streaming, Then::kNothing));
    }
  }
  const Dialect N = Dialect::kNixl, M = Dialect::kMoriioWrite;
  // Serial, prefill in flight: failures retry on a new pair; a 4xx is the client's answer.
  out.push_back(make(N, At::kPrefillSent, Event::kPrefillError, RS::kDone, 200, "", false, Then::kNewPair));
  out.push_back(make(N, At::kPrefillSent, Event::kPrefill5xx, RS::kDone, 200, "", false, Then::kNewPair));
  out.push_back(make(N, At::kPrefillSent, Event::kPrefill4xx, RS::kDone, 400, "", false, Then::kNothing));
  out.push_back(make(N, At::kPrefillSent, Event::kPrefillTimeout, RS::kDone, 200, "", false, Then::kNewPair));
  // Serial, decode in flight: NIXL retries a refused decode alone (same KV params), anything the
  // decode may have acted on with a new pair.
  for (At at : {At::kDecodeSent, At::kHeldHead}) {
    out.push_back(make(N, at, Event::kDecodeError, RS::kDone, 200, "", false, Then::kNewPair, Leg::kDecode));
    out.push_back(make(N, at, Event::kDecodeTimeout, RS::kDone, 200, "", false, Then::kNewPair, Leg::kDecode));
  }
  out.push_back(make(N, At::kDecodeSent, Event::kDecodeRefused, RS::kDone, 200, "", false, Then::kDecodeOnly,
                     Leg::kDecode));
  out.push_back(make(N, At::kDecodeSent, Event::kDecode5xx, RS::kDone, 200, "", false, Then::kNewPair, Leg::kDecode));
  out.push_back(make(N, At::kDecodeSent, Event::kDecode4xx, RS::kDone, 400, "", false, Then::kNothing));
  // Serial, streaming: nothing can be retried; the stream ends with an error event.
  out.push_back(make(N, At::kStreaming, Event::kDecodeError, RS::kFailed, 200, "decode_failed", true, Then::kNothing));
  out.push_back(
      make(N, At::kStreaming, Event::kDecodeTimeout, RS::kFailed, 200, "decode_timeout", true, Then::kNothing));

  // Concurrent, both legs in flight (with or without a held decode head).
  for (At at : {At::kDecodeSent, At::kHeldHead}) {
    out.push_back(make(M, at, Event::kPrefillError, RS::kDone, 200, "", false, Then::kNewPair));
    out.push_back(make(M, at, Event::kPrefill5xx, RS::kDone, 200, "", false, Then::kNewPair));
    out.push_back(make(M, at, Event::kPrefill4xx, RS::kDone, 400, "", false, Then::kNothing));
    out.push_back(make(M, at, Event::kPrefillTimeout, RS::kDone, 200, "", false, Then::kNewPair));
    out.push_back(make(M, at, Event::kDecodeError, RS::kDone, 200, "", false, Then::kNewPair, Leg::kDecode));
    out.push_back(make(M, at, Event::kDecodeTimeout, RS::kDone, 200, "", false, Then::kNewPair, Leg::kDecode));
  }
  // MoRIIO's request id names the decode: even a refused decode needs a new pair.
  out.push_back(make(M, At::kDecodeSent, Event::kDecodeRefused, RS::kDone, 200, "", false, Then::kNewPair,
                     Leg::kDecode));
  out.push_back(make(M, At::kDecodeSent, Event::kDecode5xx, RS::kDone, 200, "", false, Then::kNewPair, Leg::kDecode));
  out.push_back(make(M, At::kDecodeSent, Event::kDecode4xx, RS::kDone, 400, "", false, Then::kNothing));
  // Concurrent, streaming: the decode got its KV, so a prefill failing now changes nothing.
  for (Event e : {Event::kPrefillError, Event::kPrefill5xx, Event::kPrefill4xx, Event::kPrefillTimeout}) {
    out.push_back(make(M, At::kStreaming, e, RS::kDone, 200, "", false, Then::kStreamContinues));
  }
  out.push_back(make(M, At::kStreaming, Event::kDecodeError, RS::kFailed, 200, "decode_failed", true, Then::kNothing));
  out.push_back(
      make(M, At::kStreaming, Event::kDecodeTimeout, RS::kFailed, 200, "decode_timeout", true, Then::kNothing));
  return out;
}

// gtest prints a failing case by its name.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ProxySessionStates : public ::testing::TestWithParam<Case> {};

// The timeouts a case waits for are short; every other one is long enough never to fire.
void tweak_for(const Case& c, config::Topology& t) {
  // Short, but long enough for the test to reach the state first on a loaded machine.
  const auto short_timeout = scaled_ms(1000ms);
  if (c.event == Event::kPrefillTimeout) t.timeouts.prefill = short_timeout;
  if (c.event == Event::kDecodeTimeout && c.at == At::kHeldHead) t.timeouts.first_byte = short_timeout;
  if (c.event == Event::kRequestDeadline) t.timeouts.request = short_timeout;
}

// The prefill answer a decode needs (serial) or the one a concurrent prefill gives.
void answer_prefill(FakeCall& p, Dialect d) {
  if (d == Dialect::kNixl) {
    p.answer(200, "application/json", kNixlPrefillAnswer);
  } else {
    p.answer(200, "application/json", R"({"id":"cmpl-1","choices":[{"text":"x"}]})");
  }
}

TEST_P(ProxySessionStates, EventInState) {
  const Case& c = GetParam();
  Harness h(c.dialect, [&](config::Topology& t) { tweak_for(c, t); });
  FakeUpstream& fake = h.fake;
  const bool serial = c.dialect == Dialect::kNixl;

  // --- Reach the state.
  ASSERT_EQ(h.connect_and_send(), "");
  ASSERT_TRUE(h.wait_until([&] { return fake.calls.size() == (serial ? 1u : 2u); }, "the first legs"));
  std::shared_ptr<FakeCall> prefill, decode;
  ASSERT_TRUE(h.on_worker([&] { prefill = fake.of(true).at(0); }));
  if (c.at != At::kPrefillSent) {
    if (serial) {
      ASSERT_TRUE(h.on_worker([&] { answer_prefill(*prefill, c.dialect); }));
      ASSERT_TRUE(h.wait_until([&] { return fake.calls.size() == 2; }, "the decode leg"));
      EXPECT_EQ(h.transitions(RS::kPrefillSent, RS::kPrefillDone), 1u);
      EXPECT_EQ(h.transitions(RS::kPrefillDone, RS::kDecodeSent), 1u);
    } else {
      EXPECT_EQ(h.transitions(RS::kPrefillSent, RS::kDecodeSent), 1u);
    }
    ASSERT_TRUE(h.on_worker([&] { decode = fake.of(false).at(0); }));
    EXPECT_EQ(prefill->request_id(), decode->request_id());
  }
  EXPECT_EQ(h.transitions(RS::kAccepted, RS::kPaired), 1u);
  EXPECT_EQ(h.transitions(RS::kPaired, RS::kPrefillSent), 1u);
  if (c.at == At::kHeldHead || c.at == At::kStreaming) {
    ASSERT_TRUE(h.on_worker([&] { decode->head(200, {{"Content-Type", "text/event-stream"}}); }));
    EXPECT_EQ(h.counters().held_stream_heads.load(), 1u);
  }
  if (c.at == At::kStreaming) {
    ASSERT_TRUE(h.on_worker([&] { decode->body(kFirstEvent); }));
    EXPECT_EQ(h.transitions(RS::kDecodeSent, RS::kStreaming), 1u);
  } else {
    EXPECT_EQ(h.into(RS::kStreaming), 0u);
  }
  ASSERT_EQ(h.counters().in_flight.load(), 1);
  // The load ledger: the request on one prefill and one decode; the decode leg's sequence once
  // sent; the prefill's queued tokens while its leg is open (a serial prefill answered is not).
  EXPECT_EQ(h.load(Role::kPrefill).requests, 1u);
  EXPECT_EQ(h.load(Role::kDecode).requests, 1u);
  EXPECT_EQ(h.load(Role::kDecode).decode_sequences, c.at == At::kPrefillSent && serial ? 0u : 1u);
  EXPECT_EQ(h.load(Role::kPrefill).queued_prefill_tokens != 0, !serial || c.at == At::kPrefillSent);
  EXPECT_EQ(h.load(Role::kPrefill, true), h.load(Role::kPrefill));
  EXPECT_EQ(h.load(Role::kDecode, true), h.load(Role::kDecode));

  // --- The event.
  std::vector<std::shared_ptr<FakeCall>> open_at_event;
  ASSERT_TRUE(h.on_worker([&] {
    for (const auto& call : fake.calls) {
      if (call->open()) open_at_event.push_back(call);
    }
  }));
  std::shared_ptr<FakeCall> hit;  // the leg the event happened on
  switch (c.event) {
    case Event::kClientClose:
      h.client.close();
      break;
    case Event::kPrefillError:
      hit = prefill;
      ASSERT_TRUE(h.on_worker([&] { prefill->fail(UpstreamFailure::kConnectionLost, "reset by peer"); }));
      break;
    case Event::kPrefill5xx:
      hit = prefill;
      ASSERT_TRUE(h.on_worker([&] { prefill->answer(500, "application/json", R"({"error":"boom"})"); }));
      break;
    case Event::kPrefill4xx:
      hit = prefill;
      ASSERT_TRUE(h.on_worker([&] { prefill->answer(400, "application/json", R"({"error":"bad prompt"})"); }));
      break;
    case Event::kPrefillTimeout:
      hit = prefill;
      ASSERT_TRUE(h.wait_until([&] { return h.counters().prefill_deadlines.load() == 1; }, "the prefill deadline"));
      break;
    case Event::kDecodeRefused:
      hit = decode;
      ASSERT_TRUE(h.on_worker([&] { decode->fail(UpstreamFailure::kConnect, "connection refused"); }));
      break;
    case Event::kDecodeError:
      hit = decode;
      ASSERT_TRUE(h.on_worker([&] { decode->fail(UpstreamFailure::kConnectionLost, "reset by peer"); }));
      break;
    case Event::kDecode5xx:
      hit = decode;
      ASSERT_TRUE(h.on_worker([&] { decode->answer(503, "application/json", R"({"error":"busy"})"); }));
      break;
    case Event::kDecode4xx:
      hit = decode;
      ASSERT_TRUE(h.on_worker([&] { decode->answer(400, "application/json", R"({"error":"bad prompt"})"); }));
      break;
    case Event::kDecodeTimeout:
      hit = decode;
      if (c.at == At::kHeldHead) {  // the session's own timer: no event within first_byte
        ASSERT_TRUE(h.wait_until([&] { return !decode->open(); }, "the held head's deadline"));
      } else {
        const auto why = c.at == At::kStreaming ? UpstreamFailure::kIdleTimeout : UpstreamFailure::kFirstByteTimeout;
        ASSERT_TRUE(h.on_worker([&] { decode->fail(why, "timed out"); }));
      }
      break;
    case Event::kDrain:
      h.stop(scaled_ms(50ms));
      break;
    case Event::kRequestDeadline:
      ASSERT_TRUE(h.wait_until([&] { return h.counters().request_deadlines.load() == 1; }, "the request deadline"));
      break;
  }

  // --- What follows it.
  const size_t legs_before = 2 - (c.at == At::kPrefillSent ? 1 : 0);
  if (c.then == Then::kNewPair) {
    ASSERT_TRUE(h.wait_until([&] { return fake.calls.size() >= legs_before + (serial ? 1 : 2); }, "the new pair"));
    std::shared_ptr<FakeCall> p2, d2;
    ASSERT_TRUE(h.on_worker([&] { p2 = fake.calls.at(legs_before); }));
    ASSERT_TRUE(p2->prefill());
    EXPECT_NE(p2->request_id(), prefill->request_id()) << "a new pair has fresh ids";
    if (c.retry_of == Leg::kPrefill) {
      EXPECT_NE(p2->target, prefill->target) << "a prefill not tried before";
    }
    if (serial) {
      ASSERT_TRUE(h.on_worker([&] { answer_prefill(*p2, c.dialect); }));
      ASSERT_TRUE(h.wait_until([&] { return fake.calls.size() == legs_before + 2; }, "the new decode"));
    }
    ASSERT_TRUE(h.on_worker([&] { d2 = fake.calls.at(legs_before + 1); }));
    ASSERT_FALSE(d2->prefill());
    if (c.retry_of == Leg::kDecode) {
      EXPECT_NE(d2->target, decode->target) << "a decode not tried before";
    }
    ASSERT_TRUE(h.on_worker([&] {
      if (!serial) answer_prefill(*p2, c.dialect);
      d2->head(200, {{"Content-Type", "text/event-stream"}});
      d2->body(kFirstEvent);
      d2->body(kLastEvent);
      d2->complete();
    }));
  } else if (c.then == Then::kDecodeOnly) {
    ASSERT_TRUE(h.wait_until([&] { return fake.calls.size() == 3; }, "the new decode"));
    std::shared_ptr<FakeCall> d2;
    ASSERT_TRUE(h.on_worker([&] { d2 = fake.calls.at(2); }));
    ASSERT_FALSE(d2->prefill()) << "a refused NIXL decode is retried alone";
    EXPECT_NE(d2->target, decode->target);
    EXPECT_EQ(d2->request_id(), decode->request_id()) << "the same decode request";
    EXPECT_EQ(d2->request.body, decode->request.body);
    ASSERT_TRUE(h.on_worker([&] {
      d2->head(200, {{"Content-Type", "text/event-stream"}});
      d2->body(kFirstEvent);
      d2->body(kLastEvent);
      d2->complete();
    }));
  } else if (c.then == Then::kStreamContinues) {
    ASSERT_TRUE(h.on_worker([&] {
      decode->body(kLastEvent);
      decode->complete();
    }));
  }

  // --- The client's view.
  if (c.status != 0) {
    test::HttpResponse r = h.client.read_response(scaled_ms(10s));
    ASSERT_TRUE(r.ok()) << r.error;
    EXPECT_EQ(r.status, c.status) << r.body;
    if (!c.code.empty()) {
      EXPECT_NE(r.body.find("\"code\":\"" + c.code + "\""), std::string::npos) << r.body;
    }
    if (c.status == 200) {
      EXPECT_EQ(r.header("Content-Type").value_or(""), "text/event-stream");
      EXPECT_EQ(r.body.find(kFirstEvent), 0u) << r.body;
      if (c.error_event) {
        EXPECT_NE(r.body.find("data: {\"error\":"), std::string::npos) << r.body;
        EXPECT_EQ(r.body.substr(r.body.size() - 14), "data: [DONE]\n\n") << r.body;
        EXPECT_EQ(r.body.find("\"B\""), std::string::npos) << r.body;
      } else {
        EXPECT_NE(r.body.find(kLastEvent), std::string::npos) << r.body;
        EXPECT_EQ(r.body.find("\"error\""), std::string::npos) << r.body;
      }
    }
    if (c.status == 400) {
      EXPECT_EQ(r.body, R"({"error":"bad prompt"})") << "the node's 4xx is relayed as is";
    }
  } else if (c.event == Event::kDrain) {
    test::ReadResult r = h.client.read_until_closed(scaled_ms(10s));
    EXPECT_TRUE(r.closed) << r.error;
  }

  // --- The session's end.
  if (c.event != Event::kDrain) {
    ASSERT_TRUE(h.wait_ended());
    // A concurrent prefill still open when its request succeeded is an orphan (read and dropped).
    bool orphan = false;
    ASSERT_TRUE(h.on_worker([&] { orphan = !serial && c.final_state == RS::kDone && fake.open_calls() == 1; }));
    if (orphan) {
      EXPECT_EQ(h.counters().orphan_legs.open.load(), 1);
      ASSERT_TRUE(h.on_worker([&] {
        for (auto& call : fake.calls) {
          if (call->open()) {
            EXPECT_TRUE(call->prefill());
            answer_prefill(*call, c.dialect);
          }
        }
      }));
    }
    ASSERT_TRUE(h.on_worker([] {}));  // the orphan's end ran
    h.stop(0ms);
  }
  // The worker is gone: the fake and the counters are the test thread's now.
  EXPECT_EQ(h.into(c.final_state), 1u) << to_string(c.final_state);
  EXPECT_EQ(h.into(RS::kDone) + h.into(RS::kFailed) + h.into(RS::kCancelled), 1u) << "one end";
  EXPECT_EQ(h.counters().in_flight.load(), 0);
  EXPECT_EQ(h.counters().buffered.held.load(), 0) << "the budget is given back";
  EXPECT_EQ(h.counters().orphan_legs.open.load(), 0);
  for (Role role : {Role::kPrefill, Role::kDecode}) {
    EXPECT_EQ(h.load(role), discovery::LoadFigures{}) << "load left on the " << proto::to_string(role) << "s";
    EXPECT_EQ(h.load(role, true), discovery::LoadFigures{}) << "load left on a DP rank";
  }
  for (const auto& call : fake.calls) {
    EXPECT_NE(call->end, FakeCall::End::kOpen) << "leaked leg to " << call->target.to_string();
    EXPECT_NE(call->end, FakeCall::End::kPoolClosed)
        << "leg to " << call->target.to_string() << " left open until the shutdown closed it";
  }
  // Which legs the session closed itself (cancel), and which ended on their own.
  if (c.event == Event::kClientClose || c.event == Event::kDrain || c.event == Event::kRequestDeadline) {
    // Every leg open at the event is closed by the session.
    for (const auto& call : open_at_event) EXPECT_EQ(call->end, FakeCall::End::kCancelled) << call->target.to_string();
  }
  EXPECT_EQ(h.counters().client_disconnects.load(), c.final_state == RS::kCancelled ? 1u : 0u);
  EXPECT_EQ(h.counters().request_deadlines.load(), c.event == Event::kRequestDeadline ? 1u : 0u);
  if (hit && c.event == Event::kPrefillTimeout) {
    EXPECT_EQ(hit->end, FakeCall::End::kCancelled);
  }
  if (c.then == Then::kNewPair && !serial && c.retry_of == Leg::kPrefill) {
    EXPECT_EQ(decode->end, FakeCall::End::kCancelled) << "the decode waiting for KV that will not come is closed";
  }
  if (c.then == Then::kNewPair && !serial && c.retry_of == Leg::kDecode) {
    EXPECT_EQ(prefill->end, FakeCall::End::kCancelled) << "the prefill pushing to the failed decode is closed";
  }
  if (c.event == Event::kPrefill4xx && !serial && c.at != At::kStreaming) {
    EXPECT_EQ(decode->end, FakeCall::End::kCancelled);
  }
  if (c.error_event && !serial) {
    EXPECT_EQ(prefill->end, FakeCall::End::kCancelled);
  }
  // Retries: which leg, and how many legs in all.
  const uint64_t prefill_retries = c.then == Then::kNewPair && c.retry_of == Leg::kPrefill ? 1 : 0;
  const uint64_t decode_retries =
      (c.then == Then::kNewPair || c.then == Then::kDecodeOnly) && c.retry_of == Leg::kDecode ? 1 : 0;
  EXPECT_EQ(h.retries(Leg::kPrefill), prefill_retries);
  EXPECT_EQ(h.retries(Leg::kDecode), decode_retries);
  size_t legs = legs_before;
  if (c.then == Then::kNewPair) legs += 2;
  if (c.then == Then::kDecodeOnly) legs += 1;
  EXPECT_EQ(fake.calls.size(), legs);
  // Failures counted on the right leg, for the right cause.
  switch (c.event) {
    case Event::kPrefillError: EXPECT_EQ(h.failures(Leg::kPrefill, LegFailure::kConnectionLost), 1u); break;
    case Event::kPrefill5xx:
      // A concurrent prefill answering after its decode streams is only logged.
      EXPECT_EQ(h.failures(Leg::kPrefill, LegFailure::kStatus5xx), c.at == At::kStreaming ? 0u : 1u);
      break;
    case Event::kPrefill4xx:
      EXPECT_EQ(h.failures(Leg::kPrefill, LegFailure::kStatus4xx), c.at == At::kStreaming ? 0u : 1u);
      break;
    case Event::kPrefillTimeout: EXPECT_EQ(h.failures(Leg::kPrefill, LegFailure::kTimeout), 1u); break;
    case Event::kDecodeRefused: EXPECT_EQ(h.failures(Leg::kDecode, LegFailure::kConnect), 1u); break;
    case Event::kDecodeError: EXPECT_EQ(h.failures(Leg::kDecode, LegFailure::kConnectionLost), 1u); break;
    case Event::kDecode5xx: EXPECT_EQ(h.failures(Leg::kDecode, LegFailure::kStatus5xx), 1u); break;
    case Event::kDecode4xx: EXPECT_EQ(h.failures(Leg::kDecode, LegFailure::kStatus4xx), 1u); break;
    case Event::kDecodeTimeout: EXPECT_EQ(h.failures(Leg::kDecode, LegFailure::kTimeout), 1u); break;
    case Event::kClientClose:
    case Event::kDrain:
    case Event::kRequestDeadline: break;
  }
  EXPECT_EQ(h.counters().mid_stream_errors.load(), c.error_event ? 1u : 0u);
  // Latency histograms: the request once, under its final state; the first answer byte at most
  // once (always once a stream reached the client); every leg failure is a leg observation, and
  // no more legs are observed than were sent.
  const size_t outcome = c.final_state == RS::kDone ? 0 : c.final_state == RS::kFailed ? 1 : 2;
  for (size_t o = 0; o < 3; ++o) {
    EXPECT_EQ(h.counters().request_duration[o].snapshot().count, o == outcome ? 1u : 0u) << "outcome " << o;
  }
  const uint64_t ttfb = h.counters().time_to_first_byte.snapshot().count;
  EXPECT_LE(ttfb, 1u);
  if (c.at == At::kStreaming) {
    EXPECT_EQ(ttfb, 1u);
  }
  uint64_t observed = 0;
  for (Leg leg : {Leg::kPrefill, Leg::kDecode}) {
    const uint64_t n = h.counters().leg_duration[static_cast<size_t>(leg)].snapshot().count;
    uint64_t failed = 0;
    for (size_t f = 0; f < kLegFailureCount; ++f) {
      if (static_cast<LegFailure>(f) != LegFailure::kBootstrap) failed += h.failures(leg, static_cast<LegFailure>(f));
    }
    EXPECT_GE(n, failed) << to_string(leg);
    observed += n;
  }
  EXPECT_LE(observed, fake.calls.size());
}

INSTANTIATE_TEST_SUITE_P(All, ProxySessionStates, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// After the end: a concurrent prefill still open when the decode answered is an orphan.

// The decode answered first; the prefill is read to its end, or closed at its deadline.
TEST(ProxySessionOrphan, ClosedAtThePrefillDeadline) {
  Harness h(Dialect::kMoriioWrite, [](config::Topology& t) {
    t.timeouts.prefill = scaled_ms(1000ms);
  });
  ASSERT_EQ(h.connect_and_send(), "");
  ASSERT_TRUE(h.wait_until([&] { return h.fake.calls.size() == 2; }, "both legs"));
  std::shared_ptr<FakeCall> prefill, decode;
  ASSERT_TRUE(h.on_worker([&] {
    prefill = h.fake.calls.at(0);
    decode = h.fake.calls.at(1);
    decode->head(200, {{"Content-Type", "text/event-stream"}});
    decode->body(kFirstEvent);
    decode->body(kLastEvent);
    decode->complete();
  }));
  test::HttpResponse r = h.client.read_response(scaled_ms(10s));
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.status, 200);
  ASSERT_TRUE(h.wait_ended());
  EXPECT_EQ(h.into(RS::kDone), 1u);
  EXPECT_EQ(h.counters().orphan_legs.open.load(), 1) << "the open prefill counts against the limit";
  ASSERT_TRUE(h.wait_until([&] { return !prefill->open(); }, "the orphan's deadline"));
  EXPECT_EQ(prefill->end, FakeCall::End::kCancelled);
  EXPECT_EQ(h.counters().orphan_legs.open.load(), 0);
  EXPECT_EQ(h.counters().orphan_legs.closed.load(), 1u);
  EXPECT_EQ(h.counters().buffered.held.load(), 0);
}

// The router shuts down while an orphan is open: the port's close_all ends it, and the gauge
// goes back to 0.
TEST(ProxySessionOrphan, ClosedByTheShutdown) {
  Harness h(Dialect::kMoriioWrite);
  ASSERT_EQ(h.connect_and_send(), "");
  ASSERT_TRUE(h.wait_until([&] { return h.fake.calls.size() == 2; }, "both legs"));
  ASSERT_TRUE(h.on_worker([&] {
    auto decode = h.fake.calls.at(1);
    decode->answer(200, "text/event-stream", std::string(kFirstEvent) + std::string(kLastEvent));
  }));
  test::HttpResponse r = h.client.read_response(scaled_ms(10s));
  ASSERT_TRUE(r.ok()) << r.error;
  ASSERT_TRUE(h.wait_ended());
  EXPECT_EQ(h.counters().orphan_legs.open.load(), 1);
  h.stop(0ms);
  EXPECT_EQ(h.fake.close_alls, 1);
  EXPECT_EQ(h.fake.calls.at(0)->end, FakeCall::End::kPoolClosed);
  EXPECT_EQ(h.counters().orphan_legs.open.load(), 0);
  EXPECT_EQ(h.counters().in_flight.load(), 0);
}

// ---------------------------------------------------------------------------------------------
// A slow client: the decode leg is paused above kHighWater queued bytes and resumed on drain; a
// client that reads nothing for timeouts.client_write is cut off and both legs are closed.

// A loopback socket with a small receive buffer (set before connect, so the window the server
// sees is small too), the request sent.
int slow_client(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int rcvbuf = 4096;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  const std::string request = test::HttpClient::build_request(
      "POST", "/v1/completions", {{"Host", "127.0.0.1"}, {"Content-Type", "application/json"}}, kStreamBody);
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads until `marker` arrived, EOF or the deadline. True when the marker arrived.
bool read_until(int fd, std::string* out, std::string_view marker, std::chrono::microseconds bound,
                bool* eof = nullptr) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (out->find(marker) == std::string::npos) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    char buf[65536];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      if (eof) *eof = true;
      return false;
    }
    out->append(buf, static_cast<size_t>(n));
  }
  return true;
}

// The decode streams like a real one: whenever the session has not paused it, it sends events
// of 16 KiB, here until it was paused (or closed, or sent `max_events` in all). Returns the count
// of events sent so far.
size_t stream_while_resumed(Harness& h, const std::shared_ptr<FakeCall>& decode, size_t* sent, size_t max_events) {
  EXPECT_TRUE(h.on_worker([&] {
    const std::string padding(16 * 1024, 'p');
    while (!decode->paused && decode->open() && *sent < max_events) {
      decode->body("data: {\"n\":" + std::to_string(*sent) + ",\"pad\":\"" + padding + "\"}\n\n");
      ++*sent;
    }
  }));
  return *sent;
}

std::shared_ptr<FakeCall> reach_decode(Harness& h) {
  std::shared_ptr<FakeCall> decode;
  EXPECT_TRUE(h.wait_until([&] { return h.fake.calls.size() == 1; }, "the prefill leg"));
  EXPECT_TRUE(h.on_worker([&] { answer_prefill(*h.fake.calls.at(0), Dialect::kNixl); }));
  EXPECT_TRUE(h.wait_until([&] { return h.fake.calls.size() == 2; }, "the decode leg"));
  EXPECT_TRUE(h.on_worker([&] { decode = h.fake.calls.at(1); }));
  return decode;
}

// The client reads (through a small window) while the decode streams 4 MiB: the decode is paused
// whenever the client's queue passes kHighWater and resumed when it drains, and every event
// arrives once, in order.
TEST(ProxySessionBackPressure, PausedAboveTheHighWaterResumedOnDrain) {
  Harness h(Dialect::kNixl);
  const int fd = slow_client(h.port());
  ASSERT_GE(fd, 0);
  auto decode = reach_decode(h);
  ASSERT_TRUE(decode);
  ASSERT_TRUE(h.on_worker([&] { decode->head(200, {{"Content-Type", "text/event-stream"}}); }));
  constexpr size_t kEvents = 256;
  std::string received;
  bool got_all = false;
  std::thread reader([&] { got_all = read_until(fd, &received, "data: [DONE]\n\n", test::scaled(60s)); });
  size_t sent = 0;
  while (stream_while_resumed(h, decode, &sent, kEvents) < kEvents) {
    if (!h.wait_until([&] { return !decode->paused || !decode->open(); }, "a resume")) break;
  }
  ASSERT_TRUE(h.wait_until([&] { return !decode->paused; }, "the last resume"));
  ASSERT_TRUE(h.on_worker([&] {
    decode->body(kLastEvent);
    decode->complete();
  }));
  reader.join();
  ::close(fd);
  ASSERT_TRUE(got_all);
  EXPECT_GE(h.counters().backpressure_pauses.load(), 1u);
  EXPECT_GE(decode->pauses, 1);
  EXPECT_EQ(decode->pauses, decode->resumes) << "every pause was resumed";
  size_t at = 0;
  for (size_t n = 0; n < kEvents; ++n) {
    at = received.find("{\"n\":" + std::to_string(n) + ",", at);
    ASSERT_NE(at, std::string::npos) << "event " << n << " missing or out of order";
  }
  ASSERT_TRUE(h.wait_ended());
  EXPECT_EQ(h.into(RS::kDone), 1u);
  EXPECT_EQ(h.counters().client_write_stalls.load(), 0u);
  EXPECT_EQ(h.counters().buffered.held.load(), 0);
}

// A client that reads nothing: once the kernel's buffers are full the queue stops going down, and
// after timeouts.client_write the stream is aborted, the decode closed, the client cut off.
TEST(ProxySessionBackPressure, ClientReadingNothingIsCutOff) {
  Harness h(Dialect::kNixl, [](config::Topology& t) { t.timeouts.client_write = scaled_ms(300ms); });
  const int fd = slow_client(h.port());
  ASSERT_GE(fd, 0);
  auto decode = reach_decode(h);
  ASSERT_TRUE(decode);
  ASSERT_TRUE(h.on_worker([&] { decode->head(200, {{"Content-Type", "text/event-stream"}}); }));
  constexpr size_t kMaxEvents = 4096;  // 64 MiB: far more than loopback's socket buffers hold
  size_t sent = 0;
  while (stream_while_resumed(h, decode, &sent, kMaxEvents) < kMaxEvents) {
    if (!h.wait_until([&] { return !decode->paused || !decode->open(); }, "a resume or the cut")) {
      break;
    }
    bool open = true;
    ASSERT_TRUE(h.on_worker([&] { open = decode->open(); }));
    if (!open) break;
  }
  ASSERT_TRUE(h.wait_ended());
  EXPECT_EQ(h.into(RS::kFailed), 1u);
  EXPECT_EQ(h.counters().client_write_stalls.load(), 1u);
  EXPECT_EQ(decode->end, FakeCall::End::kCancelled) << "the decode is closed (vLLM frees its blocks)";
  // The client is cut off without a terminating chunk.
  std::string received;
  bool eof = false;
  read_until(fd, &received, "data: [DONE]", test::scaled(10s), &eof);
  EXPECT_TRUE(eof);
  EXPECT_EQ(received.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(received.find("0\r\n\r\n"), std::string::npos) << "no terminating chunk";
  ::close(fd);
  EXPECT_EQ(h.counters().in_flight.load(), 0);
  EXPECT_EQ(h.counters().buffered.held.load(), 0);
}

// ---------------------------------------------------------------------------------------------
// A buffered (non-stream) answer: relayed whole; a decode failing after its head is a 502.

constexpr std::string_view kJsonBody = R"({"model":"m","prompt":"hello","max_tokens":8})";
constexpr std::string_view kJsonAnswer = R"({"id":"cmpl-2","choices":[{"text":"AB"}]})";

TEST(ProxySessionJson, AnswerRelayedWholeAndBudgetGivenBack) {
  Harness h(Dialect::kNixl);
  ASSERT_EQ(h.connect_and_send(kJsonBody), "");
  auto decode = reach_decode(h);
  ASSERT_TRUE(decode);
  ASSERT_TRUE(h.on_worker([&] {
    decode->head(200, {{"Content-Type", "application/json"}});
    decode->body(kJsonAnswer.substr(0, 10));
    decode->body(kJsonAnswer.substr(10));
  }));
  EXPECT_EQ(h.transitions(RS::kDecodeSent, RS::kStreaming), 1u);
  EXPECT_EQ(h.counters().buffered.held.load(), static_cast<int64_t>(kJsonBody.size() + kJsonAnswer.size()))
      << "the body and the buffered answer hold their share of the budget";
  ASSERT_TRUE(h.on_worker([&] { decode->complete(); }));
  test::HttpResponse r = h.client.read_response(scaled_ms(10s));
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, kJsonAnswer);
  EXPECT_EQ(r.header("X-Request-Id").value_or(""), decode->request_id());
  ASSERT_TRUE(h.wait_ended());
  EXPECT_EQ(h.into(RS::kDone), 1u);
  EXPECT_EQ(h.counters().buffered.held.load(), 0);
}

TEST(ProxySessionJson, DecodeFailingAfterItsHeadIs502) {
  Harness h(Dialect::kNixl);
  ASSERT_EQ(h.connect_and_send(kJsonBody), "");
  auto decode = reach_decode(h);
  ASSERT_TRUE(decode);
  ASSERT_TRUE(h.on_worker([&] {
    decode->head(200, {{"Content-Type", "application/json"}});
    decode->body(kJsonAnswer.substr(0, 10));
    decode->fail(UpstreamFailure::kConnectionLost, "reset by peer");
  }));
  test::HttpResponse r = h.client.read_response(scaled_ms(10s));
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.status, 502);
  EXPECT_NE(r.body.find("\"code\":\"decode_failed\""), std::string::npos) << r.body;
  ASSERT_TRUE(h.wait_ended());
  EXPECT_EQ(h.into(RS::kFailed), 1u);
  EXPECT_EQ(h.retries(Leg::kDecode), 0u);
  EXPECT_EQ(h.counters().mid_stream_errors.load(), 0u);
  EXPECT_EQ(h.counters().buffered.held.load(), 0);
  h.stop(0ms);
  EXPECT_EQ(h.fake.calls.size(), 2u);
}

// ---------------------------------------------------------------------------------------------
// The decode's kv_transfer_params (node-internal: its host, KV port, engine and block ids) never
// reach the client: nulled where they can be, the answer failed where they cannot.

constexpr std::string_view kDecodeParams =
    R"({"remote_block_ids":[5,6],"remote_engine_id":"engine-d","remote_host":"127.0.0.3","remote_port":5601})";

TEST(ProxySessionKvParams, NulledInAJsonAnswer) {
  Harness h(Dialect::kNixl);
  ASSERT_EQ(h.connect_and_send(kJsonBody), "");
  auto decode = reach_decode(h);
  ASSERT_TRUE(decode);
  const std::string answer = R"({"id":"cmpl-2","choices":[{"text":"AB"}],"kv_transfer_params":)" +
                             std::string(kDecodeParams) + "}";
  ASSERT_TRUE(h.on_worker([&] { decode->answer(200, "application/json", answer); }));
  test::HttpResponse r = h.client.read_response(scaled_ms(10s));
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, R"({"id":"cmpl-2","choices":[{"text":"AB"}],"kv_transfer_params":null})");
  ASSERT_TRUE(h.wait_ended());
  EXPECT_EQ(h.into(RS::kDone), 1u);
  EXPECT_EQ(h.counters().buffered.held.load(), 0);
}

TEST(ProxySessionKvParams, NulledInTheStreamEventCarryingThemEvenSplitAcrossReads) {
  Harness h(Dialect::kNixl);
  ASSERT_EQ(h.connect_and_send(), "");
  auto decode = reach_decode(h);
  ASSERT_TRUE(decode);
  const std::string kv_event = R"(data: {"choices":[],"kv_transfer_params":)" + std::string(kDecodeParams) + "}\n\n";
  ASSERT_TRUE(h.on_worker([&] {
    decode->head(200, {{"Content-Type", "text/event-stream"}});
    decode->body(kFirstEvent);
    decode->body(kv_event.substr(0, 30));  // the key cut in two
    decode->body(kv_event.substr(30));
    decode->body(kLastEvent);
    decode->complete();
  }));
  test::HttpResponse r = h.client.read_response(scaled_ms(10s));
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, std::string(kFirstEvent) + R"(data: {"choices":[],"kv_transfer_params":null})" + "\n\n" +
                        std::string(kLastEvent));
  ASSERT_TRUE(h.wait_ended());
  EXPECT_EQ(h.into(RS::kDone), 1u);
}

// An event over kMaxPartialEvent goes out in parts, and params in it can no longer be removed:
// the stream ends with an error event instead, whether the key is in the part being flushed or
// cut by the flush (the last bytes are held back, so the next part sees it whole).
TEST(ProxySessionKvParams, AnOversizedEventCarryingThemEndsTheStreamWithoutThem) {
  const std::string padding(ProxySession::kMaxPartialEvent, 'x');
  const std::string key_cut = R"("kv_transfer_p)";
  for (const bool cut_in_the_key : {false, true}) {
    SCOPED_TRACE(cut_in_the_key ? "the key cut by the flush" : "the key in the flushed part");
    Harness h(Dialect::kNixl);
    ASSERT_EQ(h.connect_and_send(), "");
    auto decode = reach_decode(h);
    ASSERT_TRUE(decode);
    const std::string start = R"(data: {"pad":")" + padding + R"(",)";
    const std::string rest = R"("kv_transfer_params":)" + std::string(kDecodeParams) + "}\n\n";
    ASSERT_TRUE(h.on_worker([&] {
      decode->head(200, {{"Content-Type", "text/event-stream"}});
      decode->body(kFirstEvent);
      if (cut_in_the_key) {
        decode->body(start + key_cut);
        decode->body(rest.substr(key_cut.size()));
      } else {
        decode->body(start + rest.substr(0, 40));
        decode->body(rest.substr(40));
      }
      decode->body(kLastEvent);
      decode->complete();
    }));
    test::HttpResponse r = h.client.read_response(scaled_ms(10s));
    ASSERT_TRUE(r.ok()) << r.error;
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body.find("remote_block_ids"), std::string::npos);
    EXPECT_EQ(r.body.find("engine-d"), std::string::npos);
    EXPECT_NE(r.body.find("\"code\":\"decode_failed\""), std::string::npos) << r.body.substr(r.body.size() - 300);
    EXPECT_EQ(r.body.rfind(kFirstEvent, 0), 0u);
    // The error is an event of its own, after a blank line (a part of the big event went out).
    const size_t error = r.body.find("data: {\"error\"");
    ASSERT_NE(error, std::string::npos);
    EXPECT_EQ(r.body.substr(error - 2, 2), "\n\n");
    ASSERT_TRUE(h.wait_ended());
    EXPECT_EQ(h.into(RS::kFailed), 1u);
    EXPECT_EQ(h.failures(Leg::kDecode, LegFailure::kBadResponse), 1u);
  }
}

TEST(ProxySessionKvParams, AJsonAnswerCarryingThemThatIsNotJsonIs502) {
  Harness h(Dialect::kNixl);
  ASSERT_EQ(h.connect_and_send(kJsonBody), "");
  auto decode = reach_decode(h);
  ASSERT_TRUE(decode);
  const std::string answer = R"({"id":"cmpl-2","kv_transfer_params":)" + std::string(kDecodeParams);  // unclosed
  ASSERT_TRUE(h.on_worker([&] { decode->answer(200, "application/json", answer); }));
  test::HttpResponse r = h.client.read_response(scaled_ms(10s));
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.status, 502);
  EXPECT_EQ(r.body.find("remote_block_ids"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("\"code\":\"decode_failed\""), std::string::npos) << r.body;
  ASSERT_TRUE(h.wait_ended());
  EXPECT_EQ(h.into(RS::kFailed), 1u);
  EXPECT_EQ(h.counters().buffered.held.load(), 0);
}

// ---------------------------------------------------------------------------------------------
// Mooncake's pre-step: the prefill's bootstrap /query, before PAIRED.

constexpr std::string_view kMooncakeQueryAnswer = R"({"0":{"engine_id":"engine-0","worker_addr":"127.0.0.1:17000"}})";

TEST(ProxySessionMooncake, BootstrapFailureRetriesAnotherPrefill) {
  Harness h(Dialect::kMooncake);
  ASSERT_EQ(h.connect_and_send(), "");
  ASSERT_TRUE(h.wait_until([&] { return h.fake.calls.size() == 1; }, "the bootstrap query"));
  std::shared_ptr<FakeCall> query1;
  ASSERT_TRUE(h.on_worker([&] { query1 = h.fake.calls.at(0); }));
  ASSERT_TRUE(query1->bootstrap_query());
  EXPECT_EQ(h.into(RS::kPaired), 0u) << "not paired before the prefill's engine id is known";
  EXPECT_EQ(h.load(Role::kPrefill).requests, 1u) << "the pair is charged while its pre-step runs";
  EXPECT_EQ(h.load(Role::kDecode).requests, 1u);
  ASSERT_TRUE(h.on_worker([&] { query1->answer(500, "text/plain", "down"); }));
  ASSERT_TRUE(h.wait_until([&] { return h.fake.calls.size() == 2; }, "the second bootstrap query"));
  std::shared_ptr<FakeCall> query2;
  ASSERT_TRUE(h.on_worker([&] { query2 = h.fake.calls.at(1); }));
  ASSERT_TRUE(query2->bootstrap_query());
  EXPECT_NE(query2->target.host, query1->target.host) << "a prefill not tried before";
  EXPECT_EQ(h.counters().bootstrap_queries.failed.load(), 1u);
  EXPECT_EQ(h.failures(Leg::kPrefill, LegFailure::kBootstrap), 1u);
  EXPECT_EQ(h.retries(Leg::kPrefill), 1u);
  // The retry started inside the first answer: its pair is charged (once) while its pre-step
  // runs, the first pair no longer.
  EXPECT_EQ(h.load(Role::kPrefill).requests, 1u);
  EXPECT_EQ(h.load(Role::kDecode).requests, 1u);
  ASSERT_TRUE(h.on_worker([&] { query2->answer(200, "application/json", kMooncakeQueryAnswer); }));
  ASSERT_TRUE(h.wait_until([&] { return h.fake.calls.size() == 4; }, "both legs"));
  std::shared_ptr<FakeCall> prefill, decode;
  ASSERT_TRUE(h.on_worker([&] {
    prefill = h.fake.calls.at(2);
    decode = h.fake.calls.at(3);
  }));
  EXPECT_TRUE(prefill->prefill());
  EXPECT_NE(decode->request.body.find("engine-0"), std::string::npos) << decode->request.body;
  ASSERT_TRUE(h.on_worker([&] {
    prefill->answer(200, "application/json", R"({"choices":[]})");
    decode->answer(200, "text/event-stream", std::string(kFirstEvent) + std::string(kLastEvent));
  }));
  test::HttpResponse r = h.client.read_response(scaled_ms(10s));
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.status, 200);
  ASSERT_TRUE(h.wait_ended());
  EXPECT_EQ(h.into(RS::kDone), 1u);
  EXPECT_EQ(h.counters().buffered.held.load(), 0);
  EXPECT_EQ(h.load(Role::kPrefill).requests, 0u);
  EXPECT_EQ(h.load(Role::kDecode).requests, 0u);
}

// The client leaves while the bootstrap query is out: the request ends at once (no leg is ever
// sent); the query, shared by every request for that prefill, runs on and fills the cache.
TEST(ProxySessionMooncake, ClientCloseDuringTheBootstrapQuery) {
  Harness h(Dialect::kMooncake);
  ASSERT_EQ(h.connect_and_send(), "");
  ASSERT_TRUE(h.wait_until([&] { return h.fake.calls.size() == 1; }, "the bootstrap query"));
  h.client.close();
  ASSERT_TRUE(h.wait_ended());
  EXPECT_EQ(h.transitions(RS::kAccepted, RS::kCancelled), 1u);
  EXPECT_EQ(h.counters().client_disconnects.load(), 1u);
  EXPECT_EQ(h.load(Role::kPrefill).requests, 0u) << "the pending route's load goes back at once";
  EXPECT_EQ(h.load(Role::kDecode).requests, 0u);
  std::shared_ptr<FakeCall> query;
  ASSERT_TRUE(h.on_worker([&] {
    query = h.fake.calls.at(0);
    query->answer(200, "application/json", kMooncakeQueryAnswer);
  }));
  ASSERT_TRUE(h.on_worker([] {}));
  EXPECT_EQ(h.fake.calls.size(), 1u) << "no leg sent for a request whose client left";
  EXPECT_EQ(query->end, FakeCall::End::kCompleted);
  // The query filled the cache: later requests to that prefill send their legs without one.
  // (Round robin sends the next request to the other prefill, which is asked once in turn.)
  for (int i = 0; i < 2; ++i) {
    test::HttpClient next;
    ASSERT_EQ(next.connect("127.0.0.1", h.port()), "");
    ASSERT_EQ(next.send_request("POST", "/v1/completions", {{"Content-Type", "application/json"}}, kStreamBody), "");
    std::shared_ptr<FakeCall> prefill, decode;
    ASSERT_TRUE(h.wait_until(
        [&] {
          for (auto& c : std::vector<std::shared_ptr<FakeCall>>(h.fake.calls)) {  // answering starts legs
            if (c->open() && c->bootstrap_query()) c->answer(200, "application/json", kMooncakeQueryAnswer);
            if (c->open() && c->prefill()) prefill = c;
            if (c->open() && !c->prefill() && !c->bootstrap_query()) decode = c;
          }
          return prefill && decode;
        },
        "the next request's legs"));
    ASSERT_TRUE(h.on_worker([&] {
      prefill->answer(200, "application/json", R"({"choices":[]})");
      decode->answer(200, "text/event-stream", std::string(kFirstEvent) + std::string(kLastEvent));
    }));
    test::HttpResponse r = next.read_response(scaled_ms(10s));
    ASSERT_TRUE(r.ok()) << r.error;
    EXPECT_EQ(r.status, 200);
    ASSERT_TRUE(h.wait_ended());
  }
  h.stop(0ms);
  std::vector<std::string> asked;
  for (const auto& c : h.fake.calls) {
    if (c->bootstrap_query()) asked.push_back(c->target.host);
  }
  ASSERT_EQ(asked.size(), 2u) << "one query per prefill";
  EXPECT_NE(asked[0], asked[1]);
  EXPECT_EQ(h.counters().in_flight.load(), 0);
  EXPECT_EQ(h.counters().buffered.held.load(), 0);
}

// ---------------------------------------------------------------------------------------------
// A drain the request fits in: the session ends normally, then the worker's context (and its
// upstream port) goes.

TEST(ProxySessionDrain, RequestFinishingWithinTheDrainCompletes) {
  Harness h(Dialect::kMoriioWrite);
  ASSERT_EQ(h.connect_and_send(), "");
  ASSERT_TRUE(h.wait_until([&] { return h.fake.calls.size() == 2; }, "both legs"));
  std::thread stopper([&] { h.stop(scaled_ms(20s)); });
  ASSERT_TRUE(h.wait_until([] { return http::HttpWorker::current()->draining(); }, "the drain to begin"));
  ASSERT_TRUE(h.on_worker([&] {
    h.fake.calls.at(0)->answer(200, "application/json", R"({"choices":[]})");
    h.fake.calls.at(1)->answer(200, "text/event-stream", std::string(kFirstEvent) + std::string(kLastEvent));
  }));
  test::HttpResponse r = h.client.read_response(scaled_ms(10s));
  stopper.join();
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.header("Connection").value_or(""), "close");
  EXPECT_NE(r.body.find(kLastEvent), std::string::npos);
  EXPECT_EQ(h.into(RS::kDone), 1u);
  EXPECT_EQ(h.counters().client_disconnects.load(), 0u);
  EXPECT_EQ(h.counters().in_flight.load(), 0);
  EXPECT_EQ(h.fake.close_alls, 1);
  for (const auto& c : h.fake.calls) EXPECT_EQ(c->end, FakeCall::End::kCompleted);
}

// ---------------------------------------------------------------------------------------------
// A NIXL prefill that exported no KV (EOS on its first token): the decode goes out as a plain
// request that recomputes the prompt, not one waiting for blocks that never come.

TEST(ProxySessionNoKv, NixlDecodeSentWithoutKvTransferParams) {
  Harness h(Dialect::kNixl);
  ASSERT_EQ(h.connect_and_send(), "");
  ASSERT_TRUE(h.wait_until([&] { return h.fake.calls.size() == 1; }, "the prefill leg"));
  std::shared_ptr<FakeCall> prefill;
  ASSERT_TRUE(h.on_worker([&] {
    prefill = h.fake.calls.at(0);
    EXPECT_NE(prefill->request.body.find("kv_transfer_params"), std::string::npos);
    prefill->answer(200, "application/json", R"({"id":"cmpl-1","choices":[{"text":"x","finish_reason":"stop"}]})");
  }));
  ASSERT_TRUE(h.wait_until([&] { return h.fake.calls.size() == 2; }, "the decode leg"));
  std::shared_ptr<FakeCall> decode;
  ASSERT_TRUE(h.on_worker([&] { decode = h.fake.calls.at(1); }));
  EXPECT_EQ(decode->request.body.find("kv_transfer_params"), std::string::npos) << decode->request.body;
  EXPECT_EQ(h.counters().local_prefill_fallbacks.load(), 1u);
  ASSERT_TRUE(h.on_worker([&] {
    decode->answer(200, "text/event-stream", std::string(kFirstEvent) + std::string(kLastEvent));
  }));
  test::HttpResponse r = h.client.read_response(scaled_ms(10s));
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.status, 200);
  ASSERT_TRUE(h.wait_ended());
  EXPECT_EQ(h.into(RS::kDone), 1u);
}

}  // namespace
}  // namespace pdr::router::proxy
