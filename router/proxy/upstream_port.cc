#include "router/proxy/upstream_port.h"

#include <utility>

namespace pdr::router::proxy {

namespace {

// One small allocation per call on top of the pool's own: the price of the seam.
class PoolCall final : public UpstreamPort::Call {
 public:
  explicit PoolCall(std::shared_ptr<http::UpstreamCall> call) : call_(std::move(call)) {}
  void cancel() override { call_->cancel(); }
  void pause() override { call_->pause(); }
  void resume() override { call_->resume(); }
  http::UpstreamFailure failure() const override { return call_->failure(); }
  bool reused_connection() const override { return call_->reused_connection(); }

 private:
  std::shared_ptr<http::UpstreamCall> call_;
};

}  // namespace

UpstreamPort::CallPtr PoolUpstreamPort::start(const proto::HostPort& target, http::UpstreamRequest request,
                                              http::UpstreamTimeouts timeouts, http::UpstreamCallbacks callbacks) {
  return std::make_shared<PoolCall>(pool_.start(target, std::move(request), timeouts, std::move(callbacks)));
}

}  // namespace pdr::router::proxy
