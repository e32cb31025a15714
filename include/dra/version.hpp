#pragma once
#define DRA_VERSION_MAJOR 0
#define DRA_VERSION_MINOR 1
#define DRA_VERSION_PATCH 0

namespace dra {
inline constexpr const char* version = "0.1.0";
}
