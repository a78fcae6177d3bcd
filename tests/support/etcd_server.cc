#include "tests/support/etcd_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/support/http_client.h"
#include "tests/support/time_scale.h"

namespace pdr::test {

namespace {
constexpr const char* kEtcd = "/usr/bin/etcd";

std::string log_tail(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  return all.size() > 2000 ? all.substr(all.size() - 2000) : all;
}
}  // namespace

uint16_t probe_free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

EtcdServer::EtcdServer() {
  char pattern[] = "/tmp/pdr-etcd-XXXXXX";
  if (::mkdtemp(pattern) != nullptr) dir_ = pattern;
}

EtcdServer::~EtcdServer() {
  stop();
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

bool EtcdServer::available() { return ::access(kEtcd, X_OK) == 0; }

std::string EtcdServer::start(std::chrono::milliseconds timeout) {
  if (dir_.empty()) return "no temporary directory";
  const bool fixed = client_port_ != 0;
  std::string why;
  for (int attempt = 0; attempt < (fixed ? 1 : 5); ++attempt) {
    if (!fixed) {
      client_port_ = probe_free_port();
      peer_port_ = probe_free_port();
      if (client_port_ == 0 || peer_port_ == 0 || client_port_ == peer_port_) continue;
    }
    why = start_once(timeout);
    if (why.empty()) return "";
  }
  return why;
}

std::string EtcdServer::start_once(std::chrono::milliseconds timeout) {
  const std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
  const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
  const std::string log = dir_ + "/etcd.log";
  const std::string data = dir_ + "/data";
  const pid_t pid = ::fork();
  if (pid < 0) return "fork failed";
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    const std::string cluster = "default=" + peer;
    ::execl(kEtcd, kEtcd, "--data-dir", data.c_str(), "--listen-client-urls", client.c_str(),
            "--advertise-client-urls", client.c_str(), "--listen-peer-urls", peer.c_str(),
            "--initial-advertise-peer-urls", peer.c_str(), "--initial-cluster", cluster.c_str(),
            "--log-level", "warn", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  pid_ = pid;
  const auto deadline = std::chrono::steady_clock::now() + scaled(timeout);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return "etcd exited before it was healthy: " + log_tail(log);
    }
    HttpResponse health = http_request("127.0.0.1", client_port_, "GET", "/health", {}, {},
                                       std::chrono::milliseconds(500));
    if (health.ok() && health.status == 200 && health.body.find("true") != std::string::npos) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  stop();
  return "etcd not healthy in time: " + log_tail(log);
}

void EtcdServer::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

}  // namespace pdr::test
