#include "dra/torch/build_info.hpp"

#include <torch/version.h>

#include "dra/version.hpp"

#ifdef DRA_WITH_NCCL
#include <nccl.h>
#endif

namespace dra {

build_info get_build_info() {
  build_info info;
  info.version = dra::version;
  info.compiler = DRA_COMPILER_STRING;
  info.torch_version = TORCH_VERSION;
  info.gloo = true;
#ifdef DRA_WITH_NCCL
  info.nccl = true;
  info.nccl_header_version =
      std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH);
#endif
  return info;
}

}  // namespace dra
