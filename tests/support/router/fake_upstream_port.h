// A fake UpstreamPort (router/proxy/upstream_port.h) for tests that drive a worker's node calls
// by hand: every call it starts is kept, open until the test answers it, fails it or the code
// under test cancels it (which releases its callbacks at once, as the pool does).
#pragma once

#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "proto/base/status.h"
#include "router/http/upstream_client.h"
#include "router/proxy/upstream_port.h"

namespace pdr::test {

class FakeCall final : public router::proxy::UpstreamPort::Call {
 public:
  FakeCall(proto::HostPort target, http::UpstreamRequest request, http::UpstreamCallbacks callbacks)
      : target(std::move(target)), request(std::move(request)), cb(std::move(callbacks)) {}
  void cancel() override {
    cancelled = true;
    cb = {};  // released at once, as the pool does
  }
  void pause() override {}
  void resume() override {}
  http::UpstreamFailure failure() const override { return http::UpstreamFailure::kNone; }
  bool reused_connection() const override { return false; }

  bool open() const { return static_cast<bool>(cb.on_body); }
  void body(std::string_view chunk) {
    if (!open()) return;
    const http::UpstreamCallbacks copy = cb;  // a cancel() inside releases nothing while it runs
    copy.on_body(chunk);
  }
  void answer(int status, std::string_view bytes) {
    if (!open()) return;
    const http::UpstreamCallbacks copy = cb;
    copy.on_head(status, {});
    copy.on_body(bytes);
    cb = {};
    copy.on_complete();
  }
  void fail() {
    if (!open()) return;
    const http::UpstreamCallbacks copy = cb;
    cb = {};
    copy.on_error(Status(StatusCode::kIoError, "connection reset"));
  }

  const proto::HostPort target;
  const http::UpstreamRequest request;
  http::UpstreamCallbacks cb;
  bool cancelled = false;
};

class FakePort final : public router::proxy::UpstreamPort {
 public:
  CallPtr start(const proto::HostPort& target, http::UpstreamRequest&& request, http::UpstreamTimeouts,
                http::UpstreamCallbacks&& callbacks) override {
    calls.push_back(std::make_shared<FakeCall>(target, std::move(request), std::move(callbacks)));
    return calls.back();
  }
  // The worker's context is going away: calls still open fail, as the pool's do when it closes.
  void close_all() override {
    for (auto& c : calls) c->fail();
  }
  std::vector<std::shared_ptr<FakeCall>> calls;
};

}  // namespace pdr::test
