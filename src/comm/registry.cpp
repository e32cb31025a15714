// Backends registered by name (include/dra/torch/comm/communicator.hpp). The built-in ones are
// registered explicitly on first use (static registration objects in a static library are dropped
// by the linker when nothing else references their translation unit).
#include <algorithm>
#include <map>
#include <mutex>

#include "dra/error.hpp"
#include "dra/torch/comm/communicator.hpp"

namespace dra::comm {

// Defined in each backend's folder (src/comm/gloo/, src/comm/nccl/).
void register_gloo_backend();
#ifdef DRA_WITH_NCCL
void register_nccl_backend();
#endif

namespace {

struct registry {
  std::mutex mutex;
  std::map<std::string, backend_factory> factories;
};

registry& the_registry() {
  static registry r;
  return r;
}

void register_builtins() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_gloo_backend();
#ifdef DRA_WITH_NCCL
    register_nccl_backend();
#endif
  });
}

}  // namespace

void register_backend(const std::string& name, backend_factory factory) {
  if (name.empty()) dra::detail::throw_invalid("name", "a backend needs a name");
  if (!factory) dra::detail::throw_invalid("factory", "backend '" + name + "' needs a factory");
  auto& r = the_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.factories[name] = std::move(factory);
}

std::vector<std::string> backend_names() {
  register_builtins();
  auto& r = the_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, _] : r.factories) names.push_back(name);
  return names;
}

std::shared_ptr<backend> make_backend(const std::string& name, const backend_config& config) {
  register_builtins();
  backend_factory factory;
  {
    auto& r = the_registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.factories.find(name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) {
    std::string known;
    for (const auto& n : backend_names()) known += (known.empty() ? "'" : ", '") + n + "'";
    dra::detail::throw_invalid("backend", "unknown backend '" + name + "'; this build has " + known);
  }
  return factory(config);
}

}  // namespace dra::comm
