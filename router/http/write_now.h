// Writing without a write request when the socket can take the bytes at once (internal to router/http/).
//
// A uv_write costs an epoll_ctl when it completes (libuv re-arms the stream's watcher), about one
// per leg and one per client answer; most answers and requests fit the socket buffer, so they are
// written at once and only the rest goes through uv_write (bench/router/RESULTS.md, syscalls per
// request).
#pragma once

#include <uv.h>

#include <cstddef>
#include <string_view>

namespace pdr::http::detail {

// Writes as much of `data` as the socket takes now, without blocking, and returns how many bytes
// it took. 0 when anything is already queued on the stream (order is kept: libuv refuses then),
// when it would block, or on an error: the caller queues the rest with uv_write, which reports a
// failure through its callback as before.
inline size_t write_now(uv_stream_t* stream, std::string_view data) {
  if (data.empty()) return 0;
  uv_buf_t buf = uv_buf_init(const_cast<char*>(data.data()), static_cast<unsigned>(data.size()));
  const int n = uv_try_write(stream, &buf, 1);
  return n > 0 ? static_cast<size_t>(n) : 0;
}

}  // namespace pdr::http::detail
