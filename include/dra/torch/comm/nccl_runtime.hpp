#pragma once
// The NCCL library dra would load at run time (dlopen), without pulling in torch or NCCL
// headers: for build information and for callers deciding whether the NCCL backend can run.
// Defined only when dra::dra is built with the NCCL backend (DRA_WITH_NCCL).
#include <string>

namespace dra::comm {

/// Version code (e.g. 23203) of the NCCL library that loads, or 0 when none loads. Never throws.
/// Loads it on first use: `DRA_NCCL_LIBRARY` if set, else libnccl.so.2 from the loader's search
/// path (the copy torch already loaded, if any), else the library found at build time.
int nccl_runtime_version() noexcept;

/// Why NCCL could not be loaded ("" when it loaded).
std::string nccl_load_error();

}  // namespace dra::comm
