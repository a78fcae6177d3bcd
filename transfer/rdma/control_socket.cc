// Control channel socket helpers (contract: control_socket.h). The waiting is
// transfer/net/blocking_socket.h's; what is left here is the address form and the record framing.
#include "transfer/rdma/control_socket.h"

#include "transfer/net/blocking_socket.h"
#include "transfer/net/tcp_socket.h"

namespace pdr::transfer::rdma {

namespace {

Status handshake_error(const Status& status) {
  return Status(status.code(), "rdma handshake: " + status.message());
}

}  // namespace

Status control_connect(const std::string& address, ControlClock::time_point deadline, int* fd) {
  std::string host;
  std::uint16_t port = 0;
  if (Status s = split_host_port(address, &host, &port); !s) return s;
  UniqueFd connected;
  if (Status s = connect_tcp(host, port, deadline, &connected); !s) return s;
  *fd = connected.release();
  return Status::ok();
}

Status control_send_record(int fd, const std::string& record, ControlClock::time_point deadline) {
  std::string frame;
  frame.reserve(4 + record.size());
  const auto size = static_cast<std::uint32_t>(record.size());
  for (int i = 0; i < 4; ++i) frame.push_back(static_cast<char>(size >> (8 * i) & 0xff));
  frame += record;
  if (Status s = send_all(fd, frame, deadline); !s) return handshake_error(s);
  return Status::ok();
}

Status control_recv_record(int fd, std::size_t max_bytes, ControlClock::time_point deadline,
                           std::string* record) {
  unsigned char prefix[4];
  if (Status s = recv_exact(fd, prefix, 4, deadline); !s) return handshake_error(s);
  std::uint32_t size = 0;
  for (int i = 0; i < 4; ++i) size |= static_cast<std::uint32_t>(prefix[i]) << (8 * i);
  if (size > max_bytes) {
    return Status(StatusCode::kTooLarge, "handshake record is " + std::to_string(size) +
                                             " bytes, limit " + std::to_string(max_bytes));
  }
  record->resize(size);
  if (Status s = recv_exact(fd, record->data(), size, deadline); !s) return handshake_error(s);
  return Status::ok();
}

}  // namespace pdr::transfer::rdma
