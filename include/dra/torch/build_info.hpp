#pragma once
// What this build of the compiled part (dra::dra) contains.
#include <string>

namespace dra {

struct build_info {
  std::string version;
  std::string compiler;
  std::string torch_version;
  bool gloo = false;
  bool nccl = false;
  std::string nccl_header_version;  ///< empty when the NCCL backend is not compiled in
};

build_info get_build_info();

}  // namespace dra
