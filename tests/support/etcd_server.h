// A real etcd (Debian's etcd-server, /usr/bin/etcd) for tests, on loopback ports.
//
// etcd cannot listen on port 0 and report the port, so start() picks two free ports by binding
// and releasing them (bind-probe), starts etcd on them and, if etcd exits before it is healthy
// (another process took a port in between), tries again with new ports. Ready means GET /health
// answers {"health":"true"}. The data directory lives until destruction, so stop() + start()
// is an etcd restart keeping its data and ports.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace pdr::test {

class EtcdServer {
 public:
  EtcdServer();
  ~EtcdServer();  // stop(), then removes the data directory
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  static bool available();  // /usr/bin/etcd exists

  // "" on success, else why (the end of etcd's log included). Reuses the ports of an earlier
  // start when it has them.
  std::string start(std::chrono::milliseconds timeout = std::chrono::seconds(20));
  void stop();  // SIGKILL and reap; no-op when not running
  bool running() const { return pid_ > 0; }
  uint16_t client_port() const { return client_port_; }

 private:
  std::string start_once(std::chrono::milliseconds timeout);

  std::string dir_;
  pid_t pid_ = -1;
  uint16_t client_port_ = 0;
  uint16_t peer_port_ = 0;
};

// A loopback TCP port free at the time of the call (bound to 127.0.0.1:0, then released).
uint16_t probe_free_port();

}  // namespace pdr::test
