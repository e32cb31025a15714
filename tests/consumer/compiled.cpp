// Links the compiled part (dra::dra, LibTorch) from the installed package.
#include <cstdio>
#include <dra/torch/build_info.hpp>

int main() {
  const auto info = dra::get_build_info();
  std::printf("consumer: dra %s built with torch %s\n", info.version.c_str(), info.torch_version.c_str());
  return info.version.empty() ? 1 : 0;
}
