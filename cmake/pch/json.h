// Precompiled header of the simulated node and the load generator (PDR_PCH): std.h plus
// nlohmann/json, which most of their files use and which costs ~2 s per file to parse.
#pragma once

#include "std.h"

#include <nlohmann/json.hpp>
