#include "discovery/sources/etcd/etcd_client.h"

#include <algorithm>
#include <utility>

#include "router/http/upstream_client.h"

namespace pdr::discovery::sources::etcd {

namespace {

// gRPC UNAUTHENTICATED (16): etcd's "invalid auth token" and expired tokens.
constexpr int kGrpcUnauthenticated = 16;

http::UpstreamRequest post(std::string path, std::string body, const std::string& token) {
  http::UpstreamRequest request;
  request.method = "POST";
  request.path = std::move(path);
  request.headers.push_back({"Content-Type", "application/json"});
  if (!token.empty()) request.headers.push_back({"Authorization", token});
  request.body = std::move(body);
  return request;
}

}  // namespace

namespace {

http::PoolOptions pool_options(const EtcdClientOptions& options) {
  http::PoolOptions pool;
  pool.tls = options.tls;
  return pool;
}

}  // namespace

EtcdClient::EtcdClient(uv_loop_s* loop, EtcdClientOptions options)
    : pool_(std::make_unique<http::UpstreamPool>(loop, pool_options(options))),
      options_(std::move(options)),
      alive_(std::make_shared<bool>(true)) {}

EtcdClient::~EtcdClient() {
  *alive_ = false;
  pool_->close_all();
}

const proto::HostPort& EtcdClient::endpoint() const { return options_.endpoints[current_]; }

void EtcdClient::close() {
  closed_ = true;
  pool_->close_all();
}

void EtcdClient::note_unreachable() {
  if (options_.endpoints.size() > 1) current_ = (current_ + 1) % options_.endpoints.size();
}

Status EtcdClient::check_answer(const proto::EtcdAnswer& answer) {
  if (!answer.is_error) return Status::ok();
  if (answer.grpc_code == kGrpcUnauthenticated) token_.clear();
  ++stats_.failures;
  return Status(StatusCode::kRejected, "etcd: " + answer.error);
}

void EtcdClient::call(std::string path, std::string body, BodyFn done) {
  if (!options_.user.empty() && token_.empty() && path != "/v3/auth/authenticate") {
    auto alive = alive_;
    authenticate_then([this, alive, path = std::move(path), body = std::move(body),
                       done = std::move(done)](const Status& st) mutable {
      if (!*alive) return;
      if (!st) {
        done(st, 0, {});
        return;
      }
      send(std::move(path), std::move(body), std::move(done));
    });
    return;
  }
  send(std::move(path), std::move(body), std::move(done));
}

void EtcdClient::send(std::string path, std::string body, BodyFn done) {
  ++stats_.calls;
  struct State {
    int status = 0;
    std::string body;
    bool over = false;
  };
  auto state = std::make_shared<State>();
  auto alive = alive_;
  auto shared_done = std::make_shared<BodyFn>(std::move(done));
  http::UpstreamCallbacks callbacks;
  callbacks.on_head = [state](int status, const std::vector<http::Header>&) { state->status = status; };
  const size_t max_answer = std::min(options_.max_answer_bytes, proto::kMaxEtcdAnswerBytes);
  callbacks.on_body = [state, max_answer](std::string_view chunk) {
    if (state->body.size() + chunk.size() > max_answer) {
      state->over = true;
      return;
    }
    state->body.append(chunk);
  };
  callbacks.on_complete = [this, alive, state, shared_done, max_answer] {
    if (!*alive) return;
    if (state->over) {
      ++stats_.failures;
      ++stats_.bad_answers;
      (*shared_done)(Status(StatusCode::kTooLarge, "etcd answer over " + std::to_string(max_answer) + " bytes"),
                     state->status, {});
      return;
    }
    (*shared_done)(Status::ok(), state->status, state->body);
  };
  callbacks.on_error = [this, alive, shared_done](const Status& error) {
    if (!*alive) return;
    ++stats_.failures;
    note_unreachable();
    (*shared_done)(Status(StatusCode::kIoError, "etcd unreachable: " + error.message()), 0, {});
  };
  http::UpstreamTimeouts timeouts{options_.timeout, options_.timeout, options_.timeout};
  if (closed_) {
    // The pool reports kPoolClosed from the loop, through on_error.
    pool_->close_all();
  }
  pool_->start(endpoint(), post(std::move(path), std::move(body), token_), timeouts, std::move(callbacks));
}

void EtcdClient::authenticate_then(std::function<void(const Status&)> next) {
  auto alive = alive_;
  send("/v3/auth/authenticate", proto::encode_etcd_authenticate(options_.user, options_.password),
       [this, alive, next = std::move(next)](const Status& st, int, const std::string& body) {
         if (!*alive) return;
         if (!st) {
           next(st);
           return;
         }
         proto::EtcdAnswer answer;
         std::string token;
         if (Status parsed = proto::parse_etcd_token(body, &answer, &token); !parsed) {
           ++stats_.bad_answers;
           next(parsed);
           return;
         }
         if (Status checked = check_answer(answer); !checked) {
           next(checked);
           return;
         }
         if (token.empty()) {
           next(Status(StatusCode::kUnauthenticated, "etcd: authentication answered no token"));
           return;
         }
         token_ = std::move(token);
         next(Status::ok());
       });
}

EtcdClient::BodyFn EtcdClient::plain_answer(AnswerFn done) {
  return [this, done = std::move(done)](const Status& st, int, const std::string& body) {
    proto::EtcdAnswer answer;
    if (!st) return done(st, answer);
    if (Status parsed = proto::parse_etcd_answer(body, &answer); !parsed) {
      ++stats_.bad_answers;
      return done(parsed, answer);
    }
    done(check_answer(answer), answer);
  };
}

void EtcdClient::put(const std::string& key, const std::string& value, int64_t lease, AnswerFn done) {
  ++stats_.puts;
  call("/v3/kv/put", proto::encode_etcd_put(key, value, lease), plain_answer(std::move(done)));
}

void EtcdClient::delete_key(const std::string& key, AnswerFn done) {
  call("/v3/kv/deleterange", proto::encode_etcd_delete_range(key, ""), plain_answer(std::move(done)));
}

// One range_prefix() in progress: what the pages read so far add up to, and where the next starts.
struct EtcdClient::RangeState {
  RangeFn done;
  std::string end;           // range_end of the prefix
  std::string next;          // the next page's first key
  proto::EtcdRangePage page;  // limit, revision (after the first page), keys_only
  bool first = true;
  proto::EtcdRangeAnswer result;
};

void EtcdClient::range_prefix(const std::string& prefix, RangeFn done) {
  auto state = std::make_shared<RangeState>();
  state->done = std::move(done);
  state->end = proto::etcd_prefix_end(prefix);
  state->next = prefix;
  state->page.limit = std::max<int64_t>(1, options_.range_page_limit);
  range_page(std::move(state));
}

void EtcdClient::range_page(std::shared_ptr<RangeState> state) {
  ++stats_.range_pages;
  call("/v3/kv/range", proto::encode_etcd_range_page(state->next, state->end, state->page),
       [this, state](const Status& st, int, const std::string& body) {
         if (st.code() == StatusCode::kTooLarge && !state->page.keys_only) {
           // Too much for one answer: fewer key-values per page, down to one; a single
           // key-value too large alone is skipped (its key first, keys_only).
           if (state->page.limit > 1) {
             state->page.limit /= 2;
           } else {
             state->page.keys_only = true;
           }
           return range_page(state);
         }
         proto::EtcdRangeAnswer page;
         if (!st) return state->done(st, page);
         if (Status parsed = proto::parse_etcd_range(body, &page); !parsed) {
           ++stats_.bad_answers;
           return state->done(parsed, page);
         }
         if (Status checked = check_answer(page.answer); !checked) return state->done(checked, page);
         proto::EtcdRangeAnswer& result = state->result;
         if (state->first) {
           state->first = false;
           result.answer = page.answer;
           state->page.revision = page.answer.revision;  // every later page at the same revision
         }
         if (state->page.keys_only) {
           // Skipped: the pages after it are of the usual size again.
           state->page.keys_only = false;
           state->page.limit = std::max<int64_t>(1, options_.range_page_limit);
           if (!page.kvs.empty()) {
             proto::EtcdKeyValue& kv = result.kvs.emplace_back(std::move(page.kvs.front()));
             kv.value.clear();
             kv.refused = "etcd answer: key-value over " +
                          std::to_string(std::min(options_.max_answer_bytes, proto::kMaxEtcdAnswerBytes)) + " bytes";
           }
         } else {
           for (auto& kv : page.kvs) result.kvs.push_back(std::move(kv));
         }
         result.skipped += page.skipped;
         if (page.more && !page.last_key.empty()) {
           state->next = page.last_key;
           state->next.push_back('\0');
           return range_page(state);
         }
         state->done(Status::ok(), result);
       });
}

Status EtcdClient::lease_answer(const Status& st, const std::string& body, proto::EtcdLeaseAnswer* lease) {
  if (!st) return st;
  if (Status parsed = proto::parse_etcd_lease(body, lease); !parsed) {
    ++stats_.bad_answers;
    return parsed;
  }
  return check_answer(lease->answer);
}

void EtcdClient::lease_grant(int64_t ttl_seconds, LeaseFn done) {
  call("/v3/lease/grant", proto::encode_etcd_lease_grant(ttl_seconds),
       [this, done = std::move(done)](const Status& st, int, const std::string& body) {
         proto::EtcdLeaseAnswer lease;
         if (Status decoded = lease_answer(st, body, &lease); !decoded) return done(decoded, lease);
         if (lease.id == 0 || lease.ttl <= 0) {
           ++stats_.bad_answers;
           return done(Status(StatusCode::kInvalidValue, "etcd granted no lease"), lease);
         }
         done(Status::ok(), lease);
       });
}

void EtcdClient::lease_keepalive(int64_t id, LeaseFn done) {
  call("/v3/lease/keepalive", proto::encode_etcd_lease_id(id),
       [this, id, done = std::move(done)](const Status& st, int, const std::string& body) {
         proto::EtcdLeaseAnswer lease;
         if (Status decoded = lease_answer(st, body, &lease); !decoded) return done(decoded, lease);
         if (lease.ttl <= 0) {
           return done(Status(StatusCode::kNotFound, "etcd lease " + std::to_string(id) + " is gone"), lease);
         }
         done(Status::ok(), lease);
       });
}

void EtcdClient::lease_revoke(int64_t id, AnswerFn done) {
  call("/v3/lease/revoke", proto::encode_etcd_lease_id(id), plain_answer(std::move(done)));
}

std::shared_ptr<EtcdWatch> EtcdClient::watch_prefix(const std::string& prefix, int64_t start_revision,
                                                    WatchMessageFn on_message, WatchEndFn on_end) {
  ++stats_.watches;
  auto watch = std::make_shared<EtcdWatch>();
  auto alive = alive_;
  auto end = std::make_shared<WatchEndFn>(std::move(on_end));
  auto message = std::make_shared<WatchMessageFn>(std::move(on_message));
  auto status = std::make_shared<int>(0);
  std::weak_ptr<EtcdWatch> weak = watch;
  auto finish = [weak, end](const Status& st) {
    auto w = weak.lock();
    if (!w || w->ended_) return;
    w->ended_ = true;
    if (w->call_) w->call_->cancel();
    (*end)(st);
  };
  http::UpstreamCallbacks callbacks;
  callbacks.on_head = [status](int code, const std::vector<http::Header>&) { *status = code; };
  callbacks.on_body = [this, alive, weak, message, status, finish](std::string_view chunk) {
    auto w = weak.lock();
    if (!*alive || !w || w->ended_) return;
    if (!w->splitter_.feed(chunk)) {
      ++stats_.bad_answers;
      return finish(Status(StatusCode::kTooLarge, "etcd watch: a line over the limit"));
    }
    std::string_view line;
    while (w->splitter_.next_line(&line)) {
      proto::EtcdWatchAnswer answer;
      if (Status parsed = proto::parse_etcd_watch(line, &answer); !parsed) {
        ++stats_.bad_answers;
        return finish(parsed);
      }
      if (answer.answer.is_error) {
        return finish(check_answer(answer.answer));
      }
      if (*status != 200) {
        return finish(Status(StatusCode::kRejected, "etcd watch: HTTP " + std::to_string(*status)));
      }
      (*message)(answer);
      if (w->ended_) return;
    }
  };
  callbacks.on_complete = [alive, finish] {
    if (!*alive) return;
    finish(Status(StatusCode::kIoError, "etcd closed the watch stream"));
  };
  callbacks.on_error = [this, alive, finish](const Status& error) {
    if (!*alive) return;
    note_unreachable();
    finish(Status(StatusCode::kIoError, "etcd watch: " + error.message()));
  };
  // No idle timeout: a quiet prefix sends nothing. A dead etcd is noticed by the lease
  // keepalives of the caller, which then cancels and restarts the watch.
  http::UpstreamTimeouts timeouts{options_.timeout, options_.timeout, std::chrono::milliseconds(0)};
  watch->call_ = pool_->start(endpoint(),
                              post("/v3/watch",
                                   proto::encode_etcd_watch_create(prefix, proto::etcd_prefix_end(prefix),
                                                                   start_revision),
                                   token_),
                              timeouts, std::move(callbacks));
  return watch;
}

void EtcdWatch::cancel() {
  ended_ = true;
  if (call_) call_->cancel();
}

bool EtcdWatch::done() const { return ended_; }

}  // namespace pdr::discovery::sources::etcd
