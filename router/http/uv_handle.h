// Owning wrapper for one libuv handle (internal to router/http/).
//
// The handle lives in a heap block that is freed in its uv_close callback, so the C++ owner can
// be destroyed while libuv still references the memory. handle->data points at the block; the
// owner pointer stored there is what callbacks use (see owner_of).
#pragma once

#include <uv.h>

#include <functional>
#include <utility>

namespace pdr::http::detail {

template <typename H>
class UvHandle {
 public:
  UvHandle() = default;
  UvHandle(const UvHandle&) = delete;
  UvHandle& operator=(const UvHandle&) = delete;
  UvHandle(UvHandle&& o) noexcept : box_(std::exchange(o.box_, nullptr)) {}
  UvHandle& operator=(UvHandle&& o) noexcept {
    if (this != &o) {
      close();
      box_ = std::exchange(o.box_, nullptr);
    }
    return *this;
  }
  ~UvHandle() { close(); }

  // Allocates the handle and runs `init(H*)` (uv_tcp_init, uv_timer_init, ...). On failure the
  // memory is freed at once (libuv never registered the handle) and the negative errno returned.
  template <typename Init>
  int init(void* owner, Init&& init_fn) {
    close();
    auto* box = new Box;
    box->owner = owner;
    const int rc = init_fn(&box->handle);
    if (rc < 0) {
      delete box;
      return rc;
    }
    box->handle.data = box;
    box_ = box;
    return 0;
  }

  H* get() const { return box_ ? &box_->handle : nullptr; }
  uv_handle_t* base() const { return reinterpret_cast<uv_handle_t*>(get()); }
  uv_stream_t* stream() const { return reinterpret_cast<uv_stream_t*>(get()); }
  explicit operator bool() const { return box_ != nullptr; }

  template <typename Owner, typename Any>
  static Owner* owner_of(Any* h) {
    return static_cast<Owner*>(static_cast<Box*>(h->data)->owner);
  }

  // uv_close; `on_closed` runs inside the close callback after the memory is freed.
  void close(std::function<void()> on_closed = {}) {
    if (!box_) return;
    Box* b = std::exchange(box_, nullptr);
    b->on_closed = std::move(on_closed);
    uv_close(reinterpret_cast<uv_handle_t*>(&b->handle), &UvHandle::closed_cb);
  }

 private:
  struct Box {
    H handle{};
    void* owner = nullptr;
    std::function<void()> on_closed;
  };
  static void closed_cb(uv_handle_t* h) {
    Box* b = static_cast<Box*>(h->data);
    std::function<void()> fn = std::move(b->on_closed);
    delete b;
    if (fn) fn();
  }

  Box* box_ = nullptr;
};

}  // namespace pdr::http::detail
