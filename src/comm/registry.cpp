// Backends registered by name (include/dra/torch/comm/communicator.hpp). The built-in ones are
// registered explicitly on first use (static registration objects in a static library are dropped
// by the linker when nothing else references their translation unit).
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "dra/error.hpp"
#include "dra/torch/comm/communicator.hpp"

namespace dra::comm {

// Defined in each backend's folder (src/comm/gloo/, src/comm/nccl/).
void register_gloo_backend();
#ifdef DRA_WITH_NCCL
void register_nccl_backend();
#endif

namespace detail {

namespace {

struct registry {
  std::mutex mutex;
  std::map<std::string, backend_factory> factories;
};

registry& the_registry() {
  static registry r;
  return r;
}

// Letters, digits, '_', '-', '.', starting with a letter or digit: a name that travels unchanged
// through an option (Python keyword, DRA_OPTIONS, a shell), an event line and an error message.
bool is_backend_name(const std::string& name) {
  const auto plain = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  if (name.empty() || !plain(name.front())) return false;
  return std::all_of(name.begin(), name.end(), [&](char c) { return plain(c) || c == '_' || c == '-' || c == '.'; });
}

// A name as an error message shows it: quoted, control and non-ASCII bytes escaped.
std::string quoted(const std::string& name) {
  std::string out = "'";
  for (const char c : name) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", u);
      out += hex;
    } else {
      out += c;
    }
  }
  return out + "'";
}

void check_registration(const std::string& name, const backend_factory& factory) {
  if (name.empty())
    dra::detail::throw_invalid("name", "'' is empty; register the backend under a name such as 'my_backend'");
  if (!is_backend_name(name))
    dra::detail::throw_invalid("name", quoted(name) +
                                           " cannot name a backend; use letters, digits, '_', '-' and '.', "
                                           "starting with a letter or digit (e.g. 'my_backend')");
  if (!factory)
    dra::detail::throw_invalid("factory", "backend " + quoted(name) +
                                              " has none; pass a callable that returns its backend, e.g. "
                                              "[](const dra::comm::backend_config& c) { return "
                                              "std::make_shared<my_backend>(c); }");
}

// The built-ins are registered on the first use of the registry, whichever function that is, and
// without replacing a name registered already: a user's registration of "gloo" before anything
// looked a backend up still wins.
void register_builtins() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_gloo_backend();
#ifdef DRA_WITH_NCCL
    register_nccl_backend();
#endif
  });
}

// A factory's failure, as the same kind of error, naming the backend (unless it did already).
template <class Error>
[[noreturn]] void throw_naming(const std::string& name, const std::string& what) {
  if constexpr (std::is_same_v<Error, std::invalid_argument>) {
    if (what.find("'" + name + "'") != std::string::npos) dra::detail::throw_invalid("backend", what);
    dra::detail::throw_invalid("backend", "'" + name + "' refused its configuration: " + what);
  } else {
    if (what.find("'" + name + "'") != std::string::npos) throw Error(what);
    throw Error("backend '" + name + "' could not be made: " + what);
  }
}

}  // namespace

void register_builtin_backend(const std::string& name, backend_factory factory) {
  check_registration(name, factory);
  auto& r = the_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.factories.emplace(name, std::move(factory));  // never over the user's
}

}  // namespace detail

void register_backend(const std::string& name, backend_factory factory) {
  detail::check_registration(name, factory);
  detail::register_builtins();  // first, so that this registration replaces a built-in of its name
  auto& r = detail::the_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.factories[name] = std::move(factory);
}

std::vector<std::string> backend_names() {
  detail::register_builtins();
  auto& r = detail::the_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, _] : r.factories) names.push_back(name);
  return names;
}

std::shared_ptr<backend> make_backend(const std::string& name, const backend_config& config) {
  detail::register_builtins();
  backend_factory factory;
  {
    auto& r = detail::the_registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.factories.find(name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) {
    std::string known;
    for (const auto& n : backend_names()) known += (known.empty() ? "'" : ", '") + n + "'";
    dra::detail::throw_invalid("backend", "unknown backend " + detail::quoted(name) + "; this build has " + known +
                                              " (a C++ program adds its own with dra::comm::register_backend "
                                              "before it builds the controller)");
  }
  std::shared_ptr<backend> made;
  try {
    made = factory(config);
  } catch (const std::invalid_argument& e) {
    detail::throw_naming<std::invalid_argument>(name, e.what());
  } catch (const dra::timeout_error& e) {
    detail::throw_naming<dra::timeout_error>(name, e.what());
  } catch (const dra::membership_error& e) {
    detail::throw_naming<dra::membership_error>(name, e.what());
  } catch (const dra::state_mismatch_error& e) {
    detail::throw_naming<dra::state_mismatch_error>(name, e.what());
  } catch (const std::exception& e) {  // dra::comm_error, and whatever else a factory of a user throws
    detail::throw_naming<dra::comm_error>(name, e.what());
  } catch (...) {
    detail::throw_naming<dra::comm_error>(name, "it threw something that is not a std::exception; throw one");
  }
  if (!made)
    dra::detail::throw_invalid("backend", "the factory registered as '" + name +
                                              "' returned null; return the backend it makes (std::make_shared)");
  return made;
}

}  // namespace dra::comm
