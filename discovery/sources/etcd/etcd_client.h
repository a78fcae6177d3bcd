// EtcdClient: etcd's v3 API through its JSON gateway (proto/etcd_json.h), over the project's
// upstream HTTP client (router/http/upstream_client.h) on one libuv loop.
//
// Threading: like UpstreamPool, everything (constructor, calls, close(), destructor) runs on the
// loop's thread and every callback fires there, never inside the call that started it.
//
// Endpoints: calls go to the current endpoint; a call that cannot reach it (connect refused,
// timeout, connection lost) fails with kIoError and moves the client to the next endpoint, so
// the caller's retry reaches another member.
//
// Errors given to callbacks: kIoError (etcd unreachable, timeout), kMalformed / kTooLarge (an
// answer pdrouter cannot trust), kRejected (etcd answered with an error; the message is etcd's,
// the gRPC code is in the answer), kNotFound (keepalive of a lease that is gone).
//
// Authentication: with a user name, the client asks /v3/auth/authenticate for a token before
// its first call and sends it as the Authorization header; an answer saying the token is invalid
// drops it, and the next call authenticates again.
//
// TLS: with options.tls every connection to etcd is TLS (router/http/tls_client.h: the CA, the client
// certificate etcd's --client-cert-auth asks for, the endpoint's host checked against etcd's
// certificate). A handshake that fails is an unreachable endpoint (kIoError, "... tls: ...").
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "proto/base/status.h"
#include "proto/address.h"
#include "proto/etcd_json.h"

struct uv_loop_s;

namespace pdr::http {
class TlsClientContext;
class UpstreamPool;
class UpstreamCall;
}  // namespace pdr::http

namespace pdr::discovery::sources::etcd {

struct EtcdClientOptions {
  std::vector<proto::HostPort> endpoints;  // at least one
  std::string user;                        // empty: no authentication
  std::string password;
  std::chrono::milliseconds timeout{2000};  // connect (and TLS handshake), first byte of a unary answer
  std::shared_ptr<const http::TlsClientContext> tls;  // null: plain HTTP
  // range_prefix() reads at most this many key-values per call (etcd's `limit`), page after page.
  int64_t range_page_limit = 256;
  // A unary answer over this is refused (kTooLarge); at most proto::kMaxEtcdAnswerBytes.
  size_t max_answer_bytes = proto::kMaxEtcdAnswerBytes;
};

// Counters since construction (loop thread).
struct EtcdClientStats {
  uint64_t calls = 0;         // unary calls started (authentication included)
  uint64_t puts = 0;
  uint64_t failures = 0;      // calls that ended with an error status
  uint64_t bad_answers = 0;   // answers refused by the codec (kMalformed, kTooLarge, ...)
  uint64_t watches = 0;       // watch streams started
  uint64_t range_pages = 0;   // range calls range_prefix() made (a page each, retries included)
};

class EtcdWatch;

class EtcdClient {
 public:
  using AnswerFn = std::function<void(const Status&, const proto::EtcdAnswer&)>;
  using RangeFn = std::function<void(const Status&, const proto::EtcdRangeAnswer&)>;
  using LeaseFn = std::function<void(const Status&, const proto::EtcdLeaseAnswer&)>;
  using WatchMessageFn = std::function<void(const proto::EtcdWatchAnswer&)>;
  using WatchEndFn = std::function<void(const Status&)>;

  EtcdClient(uv_loop_s* loop, EtcdClientOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  void put(const std::string& key, const std::string& value, int64_t lease, AnswerFn done);
  void delete_key(const std::string& key, AnswerFn done);
  // Every key starting with `prefix`, read in pages of at most options.range_page_limit
  // key-values, all at the first page's revision (one consistent view; `done` gets them together,
  // with that revision and more = false). A page whose answer is over options.max_answer_bytes is
  // asked again with half the limit; a single key-value over it alone is skipped, its key read
  // with keys_only and handed back refused (EtcdKeyValue::refused), so no stored value can make
  // the range fail. Keys and values the codec refuses come back refused or counted in `skipped`
  // (proto/etcd_json.h), never as an error.
  void range_prefix(const std::string& prefix, RangeFn done);
  void lease_grant(int64_t ttl_seconds, LeaseFn done);
  // kNotFound when etcd says the lease is gone (TTL 0).
  void lease_keepalive(int64_t id, LeaseFn done);
  void lease_revoke(int64_t id, AnswerFn done);

  // Streams every change under `prefix` from `start_revision` (0: from now). on_message gets
  // each answer of the stream (created, events, canceled with compact_revision); on_end fires
  // once when the stream ends (error, etcd closed it, or a line the codec refuses), never after
  // EtcdWatch::cancel().
  std::shared_ptr<EtcdWatch> watch_prefix(const std::string& prefix, int64_t start_revision,
                                          WatchMessageFn on_message, WatchEndFn on_end);

  // Fails every call in flight (their callbacks fire with kIoError) and every later one.
  void close();

  const EtcdClientStats& stats() const { return stats_; }
  // The endpoint calls go to now.
  const proto::HostPort& endpoint() const;

 private:
  using BodyFn = std::function<void(const Status&, int http_status, const std::string& body)>;
  // One POST of `body` to `path`; `done` gets the whole answer body (bounded).
  void call(std::string path, std::string body, BodyFn done);
  // The answer of a put, delete or lease revoke: decoded, checked, handed to `done`.
  BodyFn plain_answer(AnswerFn done);
  // A lease grant's or keepalive's answer decoded into *lease and checked (bad ones counted).
  Status lease_answer(const Status& st, const std::string& body, proto::EtcdLeaseAnswer* lease);
  void send(std::string path, std::string body, BodyFn done);
  void authenticate_then(std::function<void(const Status&)> next);
  void note_unreachable();
  struct RangeState;
  void range_page(std::shared_ptr<RangeState> state);
  // Turns an answer that decoded fine but carries an etcd error into kRejected.
  Status check_answer(const proto::EtcdAnswer& answer);

  std::unique_ptr<http::UpstreamPool> pool_;
  EtcdClientOptions options_;
  size_t current_ = 0;
  std::string token_;
  bool closed_ = false;
  EtcdClientStats stats_;
  std::shared_ptr<bool> alive_;
};

// A running watch stream; cancel() ends it without calling on_end.
class EtcdWatch {
 public:
  void cancel();
  bool done() const;

 private:
  friend class EtcdClient;
  std::shared_ptr<http::UpstreamCall> call_;
  proto::EtcdLineSplitter splitter_;
  bool ended_ = false;
};

}  // namespace pdr::discovery::sources::etcd
