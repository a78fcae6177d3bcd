// Upper time bounds in tests are real bounds in the optimised build and would be noise under
// sanitizers (ASan ~3x, TSan 5-15x slower). tests/run.sh sets PDR_TIME_SCALE per stage; tests
// multiply every upper bound by it (never lower bounds: "not before the TTL" stays exact).
#pragma once

#include <chrono>
#include <cstdlib>

namespace pdr::test {

inline double time_scale() {
  const char* text = std::getenv("PDR_TIME_SCALE");
  const double value = text != nullptr ? std::atof(text) : 1.0;
  return value >= 1.0 ? value : 1.0;
}

template <typename Rep, typename Period>
std::chrono::microseconds scaled(std::chrono::duration<Rep, Period> bound) {
  return std::chrono::duration_cast<std::chrono::microseconds>(bound * time_scale());
}

}  // namespace pdr::test
