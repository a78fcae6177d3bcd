// TLS in the upstream client (router/http/tls_client.h through PoolOptions::tls): real sockets on
// 127.0.0.1, port 0. The upstream is a small blocking OpenSSL server on its own thread (test code
// only); certificates are made here with OpenSSL's API (a throwaway CA, server and client
// certificates, one expired, one for another name). Every wait is bounded by a deadline.
#include "router/http/tls_client.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <atomic>
#include <csignal>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "router/http/upstream_client.h"
#include "tests/support/time_scale.h"

namespace pdr::http {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Throwaway PKI

struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct CertFree {
  void operator()(X509* c) const { X509_free(c); }
};
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;
using Cert = std::unique_ptr<X509, CertFree>;

struct Identity {
  Key key;
  Cert cert;
};

Key new_key() { return Key(EVP_EC_gen("P-256")); }

// A certificate for `cn` with subjectAltName `san` (empty: none), valid from now+from_days to
// now+to_days, signed by `issuer` (null: self-signed).
Identity make_cert(const char* cn, const std::string& san, long from_days, long to_days, const Identity* issuer,
                   bool ca) {
  static long serial = 1;
  Identity id;
  id.key = new_key();
  id.cert = Cert(X509_new());
  X509* c = id.cert.get();
  X509_set_version(c, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(c), serial++);
  X509_gmtime_adj(X509_getm_notBefore(c), from_days * 86400);
  X509_gmtime_adj(X509_getm_notAfter(c), to_days * 86400);
  X509_set_pubkey(c, id.key.get());
  X509_NAME* name = X509_get_subject_name(c);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn), -1, -1, 0);
  X509* issuer_cert = issuer != nullptr ? issuer->cert.get() : c;
  EVP_PKEY* issuer_key = issuer != nullptr ? issuer->key.get() : id.key.get();
  X509_set_issuer_name(c, X509_get_subject_name(issuer_cert));
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer_cert, c, nullptr, nullptr, 0);
  auto add = [&](int nid, const char* value) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    if (ext != nullptr) {
      X509_add_ext(c, ext, -1);
      X509_EXTENSION_free(ext);
    }
  };
  add(NID_basic_constraints, ca ? "critical,CA:TRUE" : "CA:FALSE");
  if (ca) add(NID_key_usage, "critical,keyCertSign,cRLSign");
  if (!san.empty()) add(NID_subject_alt_name, san.c_str());
  X509_sign(c, issuer_key, EVP_sha256());
  return id;
}

std::string cert_pem(const Identity& id) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, id.cert.get());
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string text(data, static_cast<size_t>(n));
  BIO_free(bio);
  return text;
}

std::string key_pem(const Identity& id) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(bio, id.key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string text(data, static_cast<size_t>(n));
  BIO_free(bio);
  return text;
}

// ---------------------------------------------------------------------------------------------
// A blocking TLS HTTP server on one thread: one connection at a time, keep-alive, answers every
// request "200 hello" (or plain bytes when `plain`).

class TlsServer {
 public:
  TlsServer(const Identity& server, const Identity* client_ca, bool plain = false) : plain_(plain) {
    ctx_ = SSL_CTX_new(TLS_server_method());
    SSL_CTX_use_certificate(ctx_, server.cert.get());
    SSL_CTX_use_PrivateKey(ctx_, server.key.get());
    if (client_ca != nullptr) {
      X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx_), client_ca->cert.get());
      SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    }
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~TlsServer() {
    stop_ = true;
    thread_.join();
    close(fd_);
    SSL_CTX_free(ctx_);
  }
  uint16_t port() const { return port_; }
  int connections() const { return connections_.load(); }
  int handshakes_ok() const { return handshakes_ok_.load(); }

 private:
  void run() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const int c = accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      ++connections_;
      timeval tv{0, 50 * 1000};  // short reads: stop_ is checked between them
      setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      serve(c);
      close(c);
    }
  }

  void serve(int c) {
    if (plain_) {
      const char reply[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
      char buf[4096];
      (void)!recv(c, buf, sizeof(buf), 0);
      (void)!send(c, reply, sizeof(reply) - 1, MSG_NOSIGNAL);
      return;
    }
    SSL* ssl = SSL_new(ctx_);
    SSL_set_fd(ssl, c);
    int rc = -1;
    const auto until = Clock::now() + test::scaled(10s);
    while (!stop_ && Clock::now() < until) {
      rc = SSL_accept(ssl);
      if (rc == 1) break;
      const int e = SSL_get_error(ssl, rc);
      if (e != SSL_ERROR_WANT_READ || errno != EAGAIN) break;  // the receive timeout: try again
    }
    if (rc == 1) {
      ++handshakes_ok_;
      std::string in;
      while (!stop_) {
        char buf[4096];
        const int n = SSL_read(ssl, buf, sizeof(buf));
        if (n <= 0) {
          if (SSL_get_error(ssl, n) == SSL_ERROR_WANT_READ && errno == EAGAIN) continue;
          break;
        }
        in.append(buf, static_cast<size_t>(n));
        size_t end = 0;
        while ((end = in.find("\r\n\r\n")) != std::string::npos) {  // requests without a body
          in.erase(0, end + 4);
          const std::string reply = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";
          SSL_write(ssl, reply.data(), static_cast<int>(reply.size()));
        }
      }
    }
    ERR_clear_error();
    SSL_free(ssl);
  }

  SSL_CTX* ctx_ = nullptr;
  int fd_ = -1;
  uint16_t port_ = 0;
  bool plain_ = false;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::atomic<int> handshakes_ok_{0};
  std::thread thread_;
};

// ---------------------------------------------------------------------------------------------

struct Outcome {
  int status = 0;
  std::string body;
  bool completed = false;
  bool failed = false;
  Status error;
  bool done() const { return completed || failed; }
};

class TlsUpstreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::signal(SIGPIPE, SIG_IGN);  // as pdrouter's main: a write to a peer that closed fails, no signal
    ASSERT_EQ(uv_loop_init(&loop_), 0);
    ca_ = make_cert("test CA", "", -1, 30, nullptr, true);
    other_ca_ = make_cert("other CA", "", -1, 30, nullptr, true);
    server_ = make_cert("127.0.0.1", "IP:127.0.0.1", -1, 30, &ca_, false);
    client_ = make_cert("pdrouter", "", -1, 30, &ca_, false);
  }
  void TearDown() override {
    pool_.reset();
    const auto until = Clock::now() + 5s;
    while (uv_loop_alive(&loop_) && Clock::now() < until) uv_run(&loop_, UV_RUN_NOWAIT);
    EXPECT_EQ(uv_loop_close(&loop_), 0) << "handles left open on the client loop";
  }

  void make_pool(TlsClientOptions options) {
    std::shared_ptr<const TlsClientContext> context;
    Status st = TlsClientContext::create(options, &context);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    PoolOptions po;
    po.tls = context;
    pool_ = std::make_unique<UpstreamPool>(&loop_, po);
  }

  // One GET to 127.0.0.1:port, run to its end (bounded).
  Outcome get(uint16_t port) {
    Outcome o;
    UpstreamRequest req;
    req.method = "GET";
    req.path = "/";
    UpstreamCallbacks cb;
    cb.on_head = [&o](int status, const std::vector<Header>&) { o.status = status; };
    cb.on_body = [&o](std::string_view chunk) { o.body.append(chunk); };
    cb.on_complete = [&o] { o.completed = true; };
    cb.on_error = [&o](const Status& s) {
      o.failed = true;
      o.error = s;
    };
    UpstreamTimeouts t;
    t.connect = std::chrono::duration_cast<std::chrono::milliseconds>(test::scaled(5s));
    t.first_byte = t.connect;
    t.idle = t.connect;
    auto call = pool_->start(proto::HostPort{"127.0.0.1", port}, std::move(req), t, std::move(cb));
    const auto until = Clock::now() + test::scaled(20s);
    while (!o.done() && Clock::now() < until) uv_run(&loop_, UV_RUN_ONCE);  // the call's timers bound each wait
    EXPECT_TRUE(o.done()) << "the call did not end";
    return o;
  }

  uv_loop_t loop_{};
  std::unique_ptr<UpstreamPool> pool_;
  Identity ca_, other_ca_, server_, client_;
};

TEST_F(TlsUpstreamTest, VerifiedServerAnswersAndTheConnectionIsReused) {
  TlsServer server(server_, nullptr);
  make_pool({.ca_pem = cert_pem(ca_)});
  Outcome first = get(server.port());
  ASSERT_TRUE(first.completed) << first.error.to_string();
  EXPECT_EQ(first.status, 200);
  EXPECT_EQ(first.body, "hello");
  Outcome second = get(server.port());
  ASSERT_TRUE(second.completed) << second.error.to_string();
  EXPECT_EQ(second.body, "hello");
  EXPECT_EQ(pool_->stats().reuses, 1u);
  EXPECT_EQ(server.connections(), 1);
}

TEST_F(TlsUpstreamTest, UnknownCaFailsWithVerifyErrorAndCounts) {
  TlsServer server(server_, nullptr);
  make_pool({.ca_pem = cert_pem(other_ca_)});
  const uint64_t before = tls_error_count(TlsErrorReason::kVerify);
  Outcome o = get(server.port());
  ASSERT_TRUE(o.failed);
  EXPECT_NE(o.error.message().find("tls: certificate verify failed: "), std::string::npos) << o.error.message();
  EXPECT_EQ(tls_error_count(TlsErrorReason::kVerify), before + 1);
}

TEST_F(TlsUpstreamTest, CertificateForAnotherNameFails) {
  Identity elsewhere = make_cert("etcd.example", "DNS:etcd.example", -1, 30, &ca_, false);
  TlsServer server(elsewhere, nullptr);
  make_pool({.ca_pem = cert_pem(ca_)});
  Outcome o = get(server.port());
  ASSERT_TRUE(o.failed);
  EXPECT_NE(o.error.message().find("tls: certificate verify failed: IP address mismatch"), std::string::npos)
      << o.error.message();
}

TEST_F(TlsUpstreamTest, ServerNameOptionChecksThatName) {
  Identity named = make_cert("etcd.example", "DNS:etcd.example", -1, 30, &ca_, false);
  TlsServer server(named, nullptr);
  make_pool({.ca_pem = cert_pem(ca_), .server_name = "etcd.example"});
  Outcome o = get(server.port());
  EXPECT_TRUE(o.completed) << o.error.to_string();
}

TEST_F(TlsUpstreamTest, ExpiredCertificateFails) {
  Identity expired = make_cert("127.0.0.1", "IP:127.0.0.1", -3, -1, &ca_, false);
  TlsServer server(expired, nullptr);
  make_pool({.ca_pem = cert_pem(ca_)});
  Outcome o = get(server.port());
  ASSERT_TRUE(o.failed);
  EXPECT_NE(o.error.message().find("tls: certificate verify failed: certificate has expired"), std::string::npos)
      << o.error.message();
}

TEST_F(TlsUpstreamTest, MutualTlsNeedsTheClientCertificate) {
  TlsServer server(server_, &ca_);
  make_pool({.ca_pem = cert_pem(ca_)});
  // In TLS 1.3 the server refuses the missing certificate after the client's handshake is done:
  // the call fails on the alert ("tls: ...") or, if the request was still being written, on the
  // write ("broken pipe", "connection reset").
  Outcome without = get(server.port());
  ASSERT_TRUE(without.failed);
  EXPECT_EQ(server.handshakes_ok(), 0);
  make_pool({.ca_pem = cert_pem(ca_), .cert_pem = cert_pem(client_), .key_pem = key_pem(client_)});
  Outcome with = get(server.port());
  ASSERT_TRUE(with.completed) << with.error.to_string();
  EXPECT_EQ(with.body, "hello");
}

TEST_F(TlsUpstreamTest, PlainHttpServerFailsTheHandshake) {
  TlsServer server(server_, nullptr, /*plain=*/true);
  make_pool({.ca_pem = cert_pem(ca_)});
  const uint64_t before = tls_error_count(TlsErrorReason::kHandshake);
  Outcome o = get(server.port());
  ASSERT_TRUE(o.failed);
  EXPECT_NE(o.error.message().find("tls: handshake failed"), std::string::npos) << o.error.message();
  EXPECT_EQ(tls_error_count(TlsErrorReason::kHandshake), before + 1);
}

TEST(TlsClientContextTest, RefusesUnusablePem) {
  std::shared_ptr<const TlsClientContext> context;
  Status st = TlsClientContext::create({.ca_pem = "not a certificate"}, &context);
  EXPECT_EQ(st.message(), "tls: ca: no certificate in PEM");
  Identity ca = make_cert("CA", "", -1, 1, nullptr, true);
  Identity a = make_cert("a", "", -1, 1, &ca, false);
  Identity b = make_cert("b", "", -1, 1, &ca, false);
  st = TlsClientContext::create({.cert_pem = cert_pem(a)}, &context);
  EXPECT_NE(st.message().find("needs its key"), std::string::npos) << st.message();
  st = TlsClientContext::create({.cert_pem = cert_pem(a), .key_pem = "garbage"}, &context);
  EXPECT_NE(st.message().find("key: no private key in PEM"), std::string::npos) << st.message();
  st = TlsClientContext::create({.cert_pem = cert_pem(a), .key_pem = key_pem(b)}, &context);
  EXPECT_EQ(st.message(), "tls: client key does not match the client certificate");
  EXPECT_EQ(st.message().find("PRIVATE"), std::string::npos);
  st = TlsClientContext::create({.ca_pem = cert_pem(ca), .cert_pem = cert_pem(a), .key_pem = key_pem(a)}, &context);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
}

}  // namespace
}  // namespace pdr::http
