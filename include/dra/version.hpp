#pragma once
// The version of dra: its one source. CMake (project(VERSION)) and the Python package's metadata
// (scikit-build-core's regex provider) read the string below.
#define DRA_VERSION_MAJOR 0
#define DRA_VERSION_MINOR 2
#define DRA_VERSION_PATCH 0

namespace dra {
inline constexpr const char* version = "0.2.0";
}
