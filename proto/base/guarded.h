// run_guarded: the one way a C callback (libuv's) runs C++ code that may throw. An exception
// must not unwind through C frames, so it stops here: logged as "<component>: <what> threw: ..."
// and dropped. Callers whose callbacks must react to a failure (cancel a call, close a
// connection) catch for themselves instead.
#pragma once

#include <exception>
#include <string_view>

#include "proto/base/log.h"

namespace pdr {

template <typename Fn>
void run_guarded(std::string_view component, std::string_view what, Fn&& fn) noexcept {
  try {
    fn();
  } catch (const std::exception& e) {
    pdr::log::error("{}: {} threw: {}", component, what, e.what());
  } catch (...) {
    pdr::log::error("{}: {} threw a non-std exception", component, what);
  }
}

}  // namespace pdr
