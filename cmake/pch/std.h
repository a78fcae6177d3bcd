// Precompiled header of every product target (PDR_PCH, root CMakeLists.txt): the standard library
// headers most translation units include, parsed once per build instead of once per file (~1.2 s
// per file at any optimisation level on the CI machine). Only headers that change no behaviour by
// being visible everywhere belong here: no project headers, no headers with configuration macros.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>
