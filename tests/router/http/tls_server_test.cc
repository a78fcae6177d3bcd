// TLS on http::Server (ServerOptions::tls, router/http/tls_server.h) over real loopback sockets, with
// blocking OpenSSL clients on the test thread and the upstream client's TLS as a client: keep-alive
// and streams behave as on plain TCP (back-pressure's on_drain included), failed handshakes are
// classified (plain HTTP, old versions, garbage, timeout, a client certificate missing), set_tls()
// serves new handshakes while open connections keep theirs, and a pool keeps calls with their own
// TLS context (UpstreamRequest::tls) on connections of their own.
#include "router/http/tls_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <memory>
#include <string>
#include <thread>

#include "router/http/http_server.h"
#include "router/http/tls_client.h"
#include "router/http/upstream_client.h"
#include "tests/support/http/test_pki.h"
#include "tests/support/time_scale.h"

namespace pdr::http {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::PkiIdentity;

int connect_to(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const auto wait = test::scaled(5s);
  timeval tv{static_cast<time_t>(wait.count() / 1000000), static_cast<suseconds_t>(wait.count() % 1000000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Everything the peer sends until it closes (or the receive timeout).
std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

// A blocking TLS client over one connection.
class Client {
 public:
  Client(uint16_t port, const std::string& ca_pem, int max_version = 0, const PkiIdentity* identity = nullptr) {
    ctx_ = SSL_CTX_new(TLS_client_method());
    BIO* bio = BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size()));
    X509* ca = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
    X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx_), ca);
    X509_free(ca);
    BIO_free(bio);
    SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER, nullptr);
    if (max_version != 0) {
      SSL_CTX_set_security_level(ctx_, 0);
      SSL_CTX_set_min_proto_version(ctx_, TLS1_VERSION);
      SSL_CTX_set_max_proto_version(ctx_, max_version);
    }
    if (identity != nullptr) {
      SSL_CTX_use_certificate(ctx_, identity->cert.get());
      SSL_CTX_use_PrivateKey(ctx_, identity->key.get());
    }
    static const unsigned char kAlpn[] = {2, 'h', '2', 8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
    SSL_CTX_set_alpn_protos(ctx_, kAlpn, sizeof kAlpn);
    fd_ = connect_to(port);
    ssl_ = SSL_new(ctx_);
    SSL_set_fd(ssl_, fd_);
    SSL_set1_host(ssl_, "127.0.0.1");
    handshake_ok_ = SSL_connect(ssl_) == 1;
    ERR_clear_error();
  }
  ~Client() {
    SSL_free(ssl_);
    close(fd_);
    SSL_CTX_free(ctx_);
  }
  bool handshake_ok() const { return handshake_ok_; }
  std::string alpn() const {
    const unsigned char* p = nullptr;
    unsigned int n = 0;
    SSL_get0_alpn_selected(ssl_, &p, &n);
    return std::string(reinterpret_cast<const char*>(p), n);
  }
  std::string peer_cn() const {
    X509* cert = SSL_get1_peer_certificate(ssl_);
    char cn[128] = {};
    if (cert != nullptr) X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn);
    X509_free(cert);
    return cn;
  }
  bool send(const std::string& data) { return SSL_write(ssl_, data.data(), static_cast<int>(data.size())) > 0; }
  // Reads until `until` is in what was read (or the connection ends); returns it all.
  std::string read_until(const std::string& until, size_t max = 64 << 20) {
    std::string out;
    char buf[16384];
    while (out.find(until) == std::string::npos && out.size() < max) {
      const int n = SSL_read(ssl_, buf, sizeof buf);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    ERR_clear_error();
    return out;
  }

 private:
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
  int fd_ = -1;
  bool handshake_ok_ = false;
};

class TlsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::signal(SIGPIPE, SIG_IGN);
    ca_ = test::make_identity("test CA", "", -1, 30, nullptr, true);
    server_a_ = test::make_identity("server-a", "IP:127.0.0.1", -1, 30, &ca_, false);
    server_b_ = test::make_identity("server-b", "IP:127.0.0.1", -1, 30, &ca_, false);
    client_ = test::make_identity("client", "", -1, 30, &ca_, false);
  }
  void TearDown() override { server_.stop(2s); }

  std::shared_ptr<const TlsServerContext> context(const PkiIdentity& id, bool client_certs = false) {
    TlsServerOptions o;
    o.cert_pem = test::cert_pem(id);
    o.key_pem = test::key_pem(id);
    if (client_certs) o.client_ca_pem = test::cert_pem(ca_);
    std::shared_ptr<const TlsServerContext> out;
    Status s = TlsServerContext::create(o, &out);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    return out;
  }

  void start(std::shared_ptr<const TlsServerContext> tls, std::chrono::milliseconds header_timeout = 10s) {
    ServerOptions o;
    o.host = "127.0.0.1";
    o.tls = std::move(tls);
    o.header_read_timeout = header_timeout;
    Status s = server_.start(o, [this](Request&& r, ResponseWriter w) { handle(std::move(r), std::move(w)); });
    ASSERT_TRUE(s.is_ok()) << s.to_string();
  }

  void handle(Request&& r, ResponseWriter w) {
    if (r.path == "/big") {
      // 8 MiB written a chunk at a time, each more only once on_drain says the client read: with
      // TLS the drain must still fire as ciphertext leaves (the plaintext it carried is credited).
      w.start_stream(200, {{"Content-Type", "application/octet-stream"}});
      auto state = std::make_shared<std::pair<ResponseWriter, int>>(std::move(w), 0);
      auto pump = std::make_shared<std::function<void()>>();
      *pump = [this, state, weak = std::weak_ptr<std::function<void()>>(pump)] {
        const std::string chunk(256 * 1024, 'x');
        while (state->second < 32 && state->first.buffered_bytes() < 512 * 1024) {
          state->first.write(chunk);
          ++state->second;
          max_buffered_ = std::max<size_t>(max_buffered_, state->first.buffered_bytes());
        }
        if (state->second == 32) {
          state->first.end_stream();
          return;
        }
        if (auto self = weak.lock()) state->first.on_drain([self] { (*self)(); });
      };
      (*pump)();
      pumps_.push_back(pump);
      return;
    }
    w.send(Response::text(200, "hello " + r.path));
  }

  uint64_t failures(TlsFailure f) const {
    return server_.stats().tls_failures[static_cast<size_t>(f)].load();
  }
  template <typename Pred>
  bool eventually(Pred pred) {
    const auto until = Clock::now() + test::scaled(10s);
    while (Clock::now() < until && !pred()) std::this_thread::sleep_for(5ms);
    return pred();
  }

  Server server_;
  PkiIdentity ca_, server_a_, server_b_, client_;
  std::atomic<size_t> max_buffered_{0};
  std::vector<std::shared_ptr<std::function<void()>>> pumps_;  // worker thread only, until stop
};

TEST_F(TlsServerTest, KeepAliveOverOneHandshakeWithAlpnHttp11) {
  start(context(server_a_));
  Client c(server_.port(), test::cert_pem(ca_));
  ASSERT_TRUE(c.handshake_ok());
  EXPECT_EQ(c.alpn(), "http/1.1");
  for (const char* path : {"/one", "/two", "/three"}) {
    ASSERT_TRUE(c.send(std::string("GET ") + path + " HTTP/1.1\r\nHost: x\r\n\r\n"));
    EXPECT_NE(c.read_until(std::string("hello ") + path).find(std::string("hello ") + path), std::string::npos);
  }
  EXPECT_EQ(server_.stats().tls_handshakes.load(), 1u);
  EXPECT_EQ(server_.stats().requests.load(), 3u);
}

TEST_F(TlsServerTest, AStreamedAnswerWaitsForTheClientAndDrainsAsItReads) {
  start(context(server_a_));
  Client c(server_.port(), test::cert_pem(ca_));
  ASSERT_TRUE(c.handshake_ok());
  ASSERT_TRUE(c.send("GET /big HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::this_thread::sleep_for(100ms);  // the client reads nothing for a while: the server must not grow
  EXPECT_LE(max_buffered_.load(), 1024u * 1024);
  const std::string all = c.read_until("0\r\n\r\n", 16 << 20);  // the terminating chunk
  EXPECT_GE(all.size(), 8u << 20);
  EXPECT_NE(all.find("0\r\n\r\n"), std::string::npos);
  EXPECT_TRUE(eventually([&] { return server_.stats().output_buffered_bytes.load() == 0; }));
}

TEST_F(TlsServerTest, FailedHandshakesAreClassifiedAndTheServerGoesOn) {
  start(context(server_a_), 300ms);
  {
    const int fd = connect_to(server_.port());
    const std::string req = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_EQ(send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
    const std::string answer = read_all(fd);
    close(fd);
    EXPECT_EQ(answer.rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u) << answer;
    EXPECT_NE(answer.find("use https://"), std::string::npos);
  }
  {
    Client old(server_.port(), test::cert_pem(ca_), TLS1_1_VERSION);
    EXPECT_FALSE(old.handshake_ok());
  }
  {
    const int fd = connect_to(server_.port());
    const std::string garbage(300, '\x42');
    (void)!send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL);
    read_all(fd);
    close(fd);
  }
  {
    const int fd = connect_to(server_.port());  // says nothing
    EXPECT_EQ(read_all(fd), "");                // closed at header_read_timeout
    close(fd);
  }
  EXPECT_TRUE(eventually([&] {
    return failures(TlsFailure::kPlainHttp) == 1 && failures(TlsFailure::kVersion) == 1 &&
           failures(TlsFailure::kProtocol) == 1 && failures(TlsFailure::kTimeout) == 1;
  }));
  Client good(server_.port(), test::cert_pem(ca_));
  ASSERT_TRUE(good.handshake_ok());
  ASSERT_TRUE(good.send("GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_NE(good.read_until("hello /ok").find("hello /ok"), std::string::npos);
}

TEST_F(TlsServerTest, ClientCertificatesRequiredWhenAskedFor) {
  start(context(server_a_, /*client_certs=*/true));
  {
    Client anonymous(server_.port(), test::cert_pem(ca_));
    // TLS 1.3: the client finishes first; the server's refusal arrives with the first read.
    anonymous.send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_EQ(anonymous.read_until("hello").find("hello"), std::string::npos);
  }
  EXPECT_TRUE(eventually([&] { return failures(TlsFailure::kClientCertificate) == 1; }));
  Client known(server_.port(), test::cert_pem(ca_), 0, &client_);
  ASSERT_TRUE(known.handshake_ok());
  ASSERT_TRUE(known.send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_NE(known.read_until("hello /x").find("hello /x"), std::string::npos);
}

TEST_F(TlsServerTest, SetTlsServesNewHandshakesWhileOpenConnectionsKeepTheirs) {
  start(context(server_a_));
  Client before(server_.port(), test::cert_pem(ca_));
  ASSERT_TRUE(before.handshake_ok());
  EXPECT_EQ(before.peer_cn(), "server-a");
  server_.set_tls(context(server_b_));
  Client after(server_.port(), test::cert_pem(ca_));
  ASSERT_TRUE(after.handshake_ok());
  EXPECT_EQ(after.peer_cn(), "server-b");
  ASSERT_TRUE(before.send("GET /still HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_NE(before.read_until("hello /still").find("hello /still"), std::string::npos);
}

TEST_F(TlsServerTest, ContextCreationRefusesWhatCannotWork) {
  std::shared_ptr<const TlsServerContext> out;
  TlsServerOptions o;
  o.cert_pem = test::cert_pem(server_a_);
  o.key_pem = test::key_pem(server_b_);
  Status s = TlsServerContext::create(o, &out);
  EXPECT_EQ(s.message(), "tls: server key does not match the server certificate");
  o.key_pem = "junk";
  EXPECT_EQ(TlsServerContext::create(o, &out).message(), "tls: key: no private key in PEM (or it is encrypted)");
  o.key_pem = test::key_pem(server_a_);
  o.client_ca_pem = "junk";
  EXPECT_EQ(TlsServerContext::create(o, &out).message(), "tls: client_ca: no certificate in PEM");
  o.client_ca_pem.clear();
  ASSERT_TRUE(TlsServerContext::create(o, &out).is_ok());
  EXPECT_GT(out->not_after_unix(), std::chrono::duration_cast<std::chrono::seconds>(
                                       std::chrono::system_clock::now().time_since_epoch()).count());
  EXPECT_NE(out->subject().find("server-a"), std::string::npos);
}

// A pool without a TLS context of its own: calls that bring one (UpstreamRequest::tls) speak TLS
// on connections kept apart from the plain ones and from another context's.
TEST_F(TlsServerTest, PerCallTlsContextsArePooledApart) {
  start(context(server_a_));
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  {
    UpstreamPool pool(&loop);
    std::shared_ptr<const TlsClientContext> one, two;
    ASSERT_TRUE(TlsClientContext::create({.ca_pem = test::cert_pem(ca_)}, &one).is_ok());
    ASSERT_TRUE(TlsClientContext::create({.ca_pem = test::cert_pem(ca_)}, &two).is_ok());
    auto get = [&](const std::shared_ptr<const TlsClientContext>& tls) {
      UpstreamRequest req;
      req.method = "GET";
      req.path = "/pooled";
      req.tls = tls;
      std::string body;
      bool done = false, failed = false;
      UpstreamCallbacks cb;
      cb.on_body = [&](std::string_view chunk) { body.append(chunk); };
      cb.on_complete = [&] { done = true; };
      cb.on_error = [&](const Status&) { failed = done = true; };
      pool.start(proto::HostPort{"127.0.0.1", server_.port()}, std::move(req), {}, std::move(cb));
      const auto until = Clock::now() + test::scaled(10s);
      while (!done && Clock::now() < until) uv_run(&loop, UV_RUN_ONCE);
      return failed ? std::string("failed") : body;
    };
    EXPECT_EQ(get(one), "hello /pooled");
    EXPECT_EQ(get(one), "hello /pooled");  // reused
    EXPECT_EQ(get(two), "hello /pooled");  // another context: a connection of its own
    // Plain HTTP to the TLS port, never on a TLS connection: the listener's plain-text answer.
    EXPECT_EQ(get(nullptr), "This port speaks TLS: use https:// to connect here\n");
    EXPECT_EQ(pool.stats().reuses, 1u);
    EXPECT_EQ(server_.stats().tls_handshakes.load(), 2u);
  }
  const auto until = Clock::now() + 5s;
  while (uv_loop_alive(&loop) && Clock::now() < until) uv_run(&loop, UV_RUN_NOWAIT);
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

}  // namespace
}  // namespace pdr::http
