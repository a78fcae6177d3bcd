// Address parsing of the shared socket set-up (the part of tcp_socket.h without sockets).
#include "transfer/net/tcp_socket.h"

#include <gtest/gtest.h>

namespace pdr {
namespace {

TEST(TcpSocket, SplitsHostAndPort) {
  std::string host;
  std::uint16_t port = 0;
  ASSERT_TRUE(split_host_port("127.0.0.1:5000", &host, &port).is_ok());
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 5000);
  ASSERT_TRUE(split_host_port("[::1]:65535", &host, &port).is_ok());
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 65535);
  ASSERT_TRUE(split_host_port("node-7.local:1", &host, &port).is_ok());
  EXPECT_EQ(host, "node-7.local");
}

TEST(TcpSocket, RefusesMalformedAddresses) {
  std::string host;
  std::uint16_t port = 0;
  for (const char* text : {"", "host", "host:", ":80", "host:0", "host:65536", "host:8x", "::1:80", "[::1]80",
                           "[::1", "[::1]:"}) {
    EXPECT_EQ(split_host_port(text, &host, &port).code(), StatusCode::kBadAddress) << text;
  }
}

TEST(TcpSocket, JoinsHostAndPort) {
  EXPECT_EQ(join_host_port("127.0.10.1", 80), "127.0.10.1:80");
  EXPECT_EQ(join_host_port("::1", 80), "[::1]:80");
}

}  // namespace
}  // namespace pdr
