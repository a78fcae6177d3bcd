// RingQueue: a FIFO over one growable power-of-two array. Unlike std::deque it does not allocate
// in steady state (it only grows, doubling), which keeps per-frame bookkeeping of a connection
// allocation-free (T-7). Single-threaded: a connection and its queues belong to one I/O thread.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace pdr::transfer::tcp {

template <typename T>
class RingQueue {
 public:
  bool empty() const { return size_ == 0; }
  std::size_t size() const { return size_; }
  T& front() { return buf_[head_]; }
  const T& front() const { return buf_[head_]; }
  T& at(std::size_t i) { return buf_[(head_ + i) & (buf_.size() - 1)]; }

  void push_back(T value) {
    if (size_ == buf_.size()) grow();
    buf_[(head_ + size_) & (buf_.size() - 1)] = std::move(value);
    ++size_;
  }
  void pop_front() {
    buf_[head_] = T{};
    head_ = (head_ + 1) & (buf_.size() - 1);
    --size_;
  }
  // Keeps the elements for which keep(element) is true, in order.
  template <typename Keep>
  void filter(Keep keep) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < size_; ++i) {
      T value = std::move(at(i));
      if (keep(value)) at(kept++) = std::move(value);
    }
    for (std::size_t i = kept; i < size_; ++i) at(i) = T{};
    size_ = kept;
  }

 private:
  void grow() {
    std::vector<T> bigger(buf_.empty() ? 16 : buf_.size() * 2);
    for (std::size_t i = 0; i < size_; ++i) bigger[i] = std::move(at(i));
    buf_.swap(bigger);
    head_ = 0;
  }

  std::vector<T> buf_;
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

}  // namespace pdr::transfer::tcp
