#include "node/sim/kv_peer.h"

#include <cctype>
#include <cstdlib>

#include "transfer/net/blocking_socket.h"
#include "node/sim/dialect.h"

namespace pdr::node::sim {

using Clock = std::chrono::steady_clock;

std::optional<std::string> http_get(const proto::HostPort& server, const std::string& path,
                                    Clock::time_point deadline, std::string* body) {
  UniqueFd fd;
  if (Status s = connect_tcp(server.host, server.port, deadline, &fd); !s) return s.message();
  const std::string request =
      "GET " + path + " HTTP/1.0\r\nHost: " + server.to_string() + "\r\nConnection: close\r\n\r\n";
  if (Status s = send_all(fd.get(), request, deadline); !s) return s.message();
  std::string answer;
  char buf[16384];
  while (true) {
    size_t n = 0;
    if (Status s = recv_some(fd.get(), buf, sizeof(buf), deadline, &n); !s) return s.message();
    if (n == 0) break;
    answer.append(buf, n);
    if (answer.size() > (1u << 20)) return std::string("answer larger than 1 MiB");
  }
  const size_t head_end = answer.find("\r\n\r\n");
  if (head_end == std::string::npos || !answer.starts_with("HTTP/1.")) {
    return std::string("not an HTTP answer");
  }
  const size_t space = answer.find(' ');
  if (answer.compare(space + 1, 3, "200") != 0) {
    return "HTTP status " + answer.substr(space + 1, 3);
  }
  // The sim's server may answer chunked even to HTTP/1.0; de-chunk when it says so.
  const std::string head = answer.substr(0, head_end);
  std::string raw = answer.substr(head_end + 4);
  std::string lower;
  for (char c : head) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (lower.find("transfer-encoding: chunked") == std::string::npos) {
    *body = std::move(raw);
    return std::nullopt;
  }
  body->clear();
  size_t pos = 0;
  while (true) {
    const size_t eol = raw.find("\r\n", pos);
    if (eol == std::string::npos) return std::string("truncated chunked body");
    const size_t size = std::strtoul(raw.substr(pos, eol - pos).c_str(), nullptr, 16);
    if (size == 0) return std::nullopt;
    if (eol + 2 + size > raw.size()) return std::string("truncated chunk");
    body->append(raw, eol + 2, size);
    pos = eol + 2 + size + 2;
  }
}

SimError kv_peer_error(std::string message) {
  return SimError{502, "kv_peer_unreachable", std::move(message)};
}

std::optional<SimError> resolve_kv_peer(const SimDialect& dialect, const KvBlocks& blocks,
                                        Clock::time_point deadline, proto::HostPort* out) {
  if (blocks.peer_address.empty()) {
    return kv_peer_error("the request does not say where the prefill's KV is (no peer address)");
  }
  return dialect.resolve_peer(blocks, deadline, out);
}

}  // namespace pdr::node::sim
