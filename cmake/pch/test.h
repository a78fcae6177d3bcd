// Precompiled header of the GoogleTest unit tests (PDR_PCH): std.h plus GoogleTest and GoogleMock
// (~1.5 s per file to parse).
#pragma once

#include "std.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
