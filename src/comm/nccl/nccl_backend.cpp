// The NCCL backend: communicator and rebuild routine.
//
// Cases the rebuild routine handles (the mapping itself is in dra/comm/nccl_plan.hpp):
//  1. first init            : new rank 0 creates an id (ncclGetUniqueId), publishes it through the
//                             c10d store; every member runs ncclCommInitRankConfig with
//                             blocking = 0 and polls ncclCommGetAsyncError until ready.
//  2. leaver                : self not in the new world: release the old communicator (abort if
//                             the rebuild is abortive, else finalize -> destroy) and return null.
//  3. unchanged membership  : keep the communicator, only the epoch changes. With a fault
//                             reported: abort it and fresh-init.
//  4. shrink (NCCL >= 2.27) : survivors call ncclCommShrink with the excluded old ranks; ranks are
//                             renumbered contiguously in the old order (shrink_rank_map), so the
//                             path is taken only when new_members is that order.
//  5. abortive shrink       : the same with NCCL_SHRINK_ABORT; afterwards every survivor releases
//                             the parent with ncclCommAbort, never destroy (a destroy hangs).
//  6. grow (NCCL >= 2.29)   : old rank 0 creates the single-use grow id (ncclCommGetUniqueId) and
//                             publishes it; old ranks call ncclCommGrow on their communicator
//                             (rank -1), joiners call it with no parent and their new rank; the
//                             parent is then released (finalize -> destroy).
//  7. fast path unavailable : library older than the gate, symbol missing, a reordering or a mixed
//                             leave+join, a grow together with a fault, or this rank holds no
//                             usable parent -> fresh init (case 1) after releasing the parent.
//  8. disagreement          : before a fast path every new member votes through the store; one
//                             "no" (e.g. a rank whose parent was aborted) sends all to fresh init.
//  9. fast path fails       : after it, members vote again; any failure or timeout -> every
//                             member aborts the new and the old communicator, then fresh-inits
//                             under a new store key with a fresh timeout.
// 10. init/shrink/grow timeout: the communicator being built is aborted and dra::timeout_error is
//                             thrown; any NCCL error: aborted, dra::comm_error.
// 11. any exception leaving the routine aborts every communicator it still holds.
// Teardown order is fixed: finalize (polled, bounded) -> destroy; any failure or timeout on the
// way -> abort. Every wait is bounded by the request's timeout; nothing blocks forever.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <sstream>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "../rendezvous_keys.hpp"
#include "dra/error.hpp"
#include "dra/torch/comm/nccl.hpp"
#include "nccl_internal.hpp"

namespace dra::comm {
namespace {

using namespace nccl_detail;

std::chrono::milliseconds remaining(clock_type::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
  // c10d treats a zero timeout as "wait forever": never pass one.
  return std::max(left, std::chrono::milliseconds(1));
}

std::vector<std::uint8_t> to_bytes(const nccl_unique_id& id) {
  return std::vector<std::uint8_t>(id.bytes.begin(), id.bytes.end());
}

void store_wait(c10d::Store& store, const std::string& key, clock_type::time_point deadline,
                std::chrono::milliseconds timeout) {
  try {
    store.wait({key}, remaining(deadline));
  } catch (const c10::Error& e) {
    throw timeout_error("store key '" + key + "' not set within " + std::to_string(timeout.count()) +
                        " ms (a peer did not reach this rebuild): " + e.what_without_backtrace());
  }
}

nccl_unique_id fetch_id(c10d::Store& store, const std::string& key, clock_type::time_point deadline,
                        std::chrono::milliseconds timeout) {
  store_wait(store, key, deadline, timeout);
  const auto bytes = store.get(key);
  nccl_unique_id id;
  if (bytes.size() != id.bytes.size())
    throw comm_error("store key '" + key + "' holds " + std::to_string(bytes.size()) + " bytes, not an NCCL id");
  std::copy(bytes.begin(), bytes.end(), id.bytes.begin());
  return id;
}

/// Every one of `voters` adds its vote; the last one to vote opens the result. True iff all
/// voted yes. Bounded by the deadline (timeout_error when a voter is missing).
bool unanimous(c10d::Store& store, const std::string& base, int voters, bool yes, clock_type::time_point deadline,
               std::chrono::milliseconds timeout) {
  if (yes) store.add(base + "/yes", 1);  // before the count, so "done" implies every yes is in
  if (store.add(base + "/count", 1) == voters) store.set(base + "/done", std::vector<std::uint8_t>{1});
  store_wait(store, base + "/done", deadline, timeout);
  return store.add(base + "/yes", 0) == voters;
}

std::string json_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

// ---- backend ----------------------------------------------------------------------------------

nccl_backend::nccl_backend(std::shared_ptr<nccl_api> api, nccl_backend_options options)
    : api_(std::move(api)), options_(std::move(options)), keys_(std::make_shared<detail::rendezvous_keys>()) {
  if (!api_) throw std::invalid_argument("nccl_backend api: null; pass dra::comm::load_nccl_api()");
  if (options_.device >= 0) {
    // Fail here, before any NCCL call, rather than in the middle of a rebuild.
    if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA))
      throw comm_error(
          "nccl_backend: this process's PyTorch has no CUDA support; the NCCL backend needs a CUDA build "
          "of torch and a GPU (use Gloo on CPUs)");
    const auto count = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->deviceCount();
    if (options_.device >= count)
      throw comm_error("nccl_backend: device cuda:" + std::to_string(options_.device) + " does not exist (" +
                       std::to_string(count) + " visible CUDA devices)");
  }
  if (!options_.log) {
    options_.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  }
}

std::unique_ptr<communicator> nccl_backend::rebuild(std::unique_ptr<communicator> current,
                                                    const rebuild_request& request,
                                                    const c10::intrusive_ptr<c10d::Store>& store) {
  // ---- validate (bad input changes nothing) ----
  if (request.new_members.empty())
    throw std::invalid_argument("rebuild_request.new_members: empty; a world needs at least one member");
  {
    auto sorted = request.new_members;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
      throw std::invalid_argument("rebuild_request.new_members: duplicate universe id; list each member once");
  }
  if (request.self < 0) throw std::invalid_argument("rebuild_request.self: negative; set this process's universe id");
  if (request.timeout.count() <= 0)
    throw std::invalid_argument("rebuild_request.timeout: must be positive (a zero timeout would wait forever)");
  if (!store) throw std::invalid_argument("store: null; pass the c10d store shared by the world");

  const auto started = clock_type::now();
  const auto timeout = request.timeout;
  const auto collective_timeout = request.collective_timeout.count() > 0 ? request.collective_timeout : timeout;
  const auto poll = options_.poll_interval;
  const std::string base = options_.key_prefix + "/" + std::to_string(request.epoch);

  // The parent: only an NCCL communicator of the old world that still holds a usable handle.
  std::unique_ptr<nccl_communicator> parent;
  if (current) {
    if (auto* p = dynamic_cast<nccl_communicator*>(current.get()); p && p->handle()) {
      current.release();
      parent.reset(p);
    } else {
      current->abort();
      current.reset();
    }
  }
  const auto features = api_->features();
  nccl_plan plan = plan_rebuild(request.old_members, request.new_members, request.self, request.abortive,
                                parent != nullptr, features);
  if (plan.path == nccl_path::keep && parent->revoked()) {
    // Revoked after a fault: still shrinkable, but no longer fit to keep.
    plan = plan_rebuild(request.old_members, request.new_members, request.self, request.abortive, false, features);
  }
  last_plan_ = plan;

  auto log = [&](const std::string& event, const std::string& fields) {
    std::ostringstream line;
    line << "{\"event\":\"" << event << "\",\"backend\":\"nccl\",\"epoch\":" << request.epoch
         << ",\"self\":" << request.self << ",\"old_size\":" << request.old_members.size()
         << ",\"new_size\":" << request.new_members.size() << ",\"runtime_nccl\":\""
         << nccl_version_string(features.runtime_version) << "\"" << fields << "}";
    options_.log(line.str());
  };
  log("nccl_rebuild_plan", ",\"path\":\"" + std::string(to_string(plan.path)) + "\",\"abortive\":" +
                               (plan.abortive ? "true" : "false") + ",\"reason\":\"" + json_escape(plan.reason) + "\"");

  // Whatever escapes from here aborts every communicator still held (case 11).
  nccl_handle building = nullptr;
  auto abort_all = [&]() noexcept {
    if (building) api_->comm_abort(std::exchange(building, nullptr));
    if (parent) parent->abort();
  };
  auto done = [&](nccl_path path, std::unique_ptr<communicator> result) {
    last_path_ = path;
    if (result && plan.new_rank == 0) {  // every key of this world's rendezvous, whoever wrote it
      std::vector<std::string> keys{base + "/grow_id", base + "/init_id/0", base + "/init_id/1"};
      for (const char* vote : {"/vote_fast", "/vote_done"})
        for (const char* k : {"/yes", "/count", "/done"}) keys.push_back(base + vote + k);
      keys_->built(std::move(keys), store);
    }
    const auto ms = std::chrono::duration<double, std::milli>(clock_type::now() - started).count();
    std::ostringstream f;
    f << ",\"path\":\"" << to_string(path) << "\",\"rank\":" << plan.new_rank << ",\"ms\":" << ms;
    log("nccl_rebuild_done", f.str());
    return result;
  };
  auto make = [&](nccl_handle h, std::uint64_t epoch) {
    return std::make_unique<nccl_communicator>(api_, h, plan.new_rank, plan.new_size, epoch, options_.device,
                                               collective_timeout, poll);
  };

  int attempt = 0;  // store keys of a fresh init after a failed fast path differ from the first
  try {
    // ---- case 2: leaver ----
    if (plan.path == nccl_path::leave) {
      if (parent)
        release_handle(*api_, parent->release(), plan.release_parent_with_abort || parent->revoked(), timeout, poll);
      return done(nccl_path::leave, nullptr);
    }

    // ---- cases 3-6 and 8: fast paths, after a unanimous vote of the new world ----
    auto deadline = clock_type::now() + timeout;
    bool fast = needs_agreement(plan);
    // Every member votes, a first init too: whether a rank knows a previous world is its own
    // knowledge (a joiner, a member whose last build failed), so whether to vote must not depend on it.
    if (!unanimous(*store, base + "/vote_fast", plan.new_size, fast, deadline, timeout) && fast) {
      log("nccl_rebuild_fallback", ",\"from\":\"" + std::string(to_string(plan.path)) +
                                       "\",\"reason\":\"another member cannot take this path\"");
      fast = false;
    }
    if (fast && plan.path == nccl_path::keep) {
      parent->epoch_ = request.epoch;
      parent->set_timeout(collective_timeout);
      std::unique_ptr<communicator> kept = std::move(parent);
      return done(nccl_path::keep, std::move(kept));
    }
    if (fast) {
      bool ok = true;
      std::string failure;
      try {
        device_scope scope(options_.device);
        const nccl_config config{};
        nccl_result r = nccl_result::success;
        if (plan.path == nccl_path::shrink) {
          if (parent->revoked()) {
            // A revoked communicator becomes shrinkable once quiescent.
            wait_ready(*api_, parent->handle(), deadline, poll, nullptr);
          }
          r = api_->comm_shrink(parent->handle(), plan.exclude_ranks, &building, config, plan.abortive);
        } else {  // grow
          const std::string key = base + "/grow_id";
          if (plan.joiner) {
            const auto id = fetch_id(*store, key, deadline, timeout);
            r = api_->comm_grow(nullptr, plan.new_size, &id, plan.new_rank, &building, config);
          } else if (plan.grow_root) {
            nccl_unique_id id;
            r = api_->comm_get_grow_id(parent->handle(), &id);
            if (r != nccl_result::success)
              throw comm_error("ncclCommGetUniqueId failed: " + describe(*api_, parent->handle(), r));
            store->set(key, to_bytes(id));
            r = api_->comm_grow(parent->handle(), plan.new_size, &id, -1, &building, config);
          } else {
            r = api_->comm_grow(parent->handle(), plan.new_size, nullptr, -1, &building, config);
          }
        }
        const std::string what = plan.path == nccl_path::shrink ? "ncclCommShrink" : "ncclCommGrow";
        nccl_handle h = std::exchange(building, nullptr);
        if (r != nccl_result::success && r != nccl_result::in_progress) {
          const auto message = describe(*api_, parent ? parent->handle() : nullptr, r);
          if (h) api_->comm_abort(h);
          throw comm_error(what + " failed: " + message);
        }
        if (!h) throw comm_error(what + " returned no communicator");
        finish_or_abort(*api_, h, deadline, poll, timeout, what);  // aborts h when it throws
        building = h;
      } catch (const std::exception& e) {
        ok = false;
        failure = e.what();
      }
      // Case 9: everyone learns whether every member's fast path succeeded.
      const bool all_ok =
          unanimous(*store, base + "/vote_done", plan.new_size, ok, clock_type::now() + timeout, timeout);
      if (all_ok) {
        if (parent) {  // a joiner has none
          release_handle(*api_, parent->release(), plan.release_parent_with_abort || parent->revoked(), timeout, poll);
          parent.reset();
        }
        auto result = make(std::exchange(building, nullptr), request.epoch);
        return done(plan.path, std::move(result));
      }
      log("nccl_rebuild_fallback", ",\"from\":\"" + std::string(to_string(plan.path)) + "\",\"reason\":\"" +
                                       json_escape(ok ? "another member's fast path failed" : failure) + "\"");
      if (building) api_->comm_abort(std::exchange(building, nullptr));
      if (parent) parent->abort();  // its state after a failed shrink/grow is unknown
      deadline = clock_type::now() + timeout;
      attempt = 1;
    }

    // ---- cases 1 and 7: fresh init (after releasing the parent) ----
    if (parent) {
      release_handle(*api_, parent->release(), plan.release_parent_with_abort || parent->revoked(), timeout, poll);
      parent.reset();
    }
    const std::string key = base + "/init_id/" + std::to_string(attempt);
    nccl_unique_id id;
    if (plan.new_rank == 0) {
      const auto r = api_->get_unique_id(&id);
      if (r != nccl_result::success) throw comm_error("ncclGetUniqueId failed: " + api_->error_string(r));
      store->set(key, to_bytes(id));
    } else {
      id = fetch_id(*store, key, deadline, timeout);
    }
    device_scope scope(options_.device);
    nccl_config config{};
    const auto r = api_->comm_init_rank(&building, plan.new_size, id, plan.new_rank, config);
    if (r != nccl_result::success && r != nccl_result::in_progress) {
      const auto message = describe(*api_, building, r);
      throw comm_error("ncclCommInitRankConfig failed: " + message);
    }
    if (!building) throw comm_error("ncclCommInitRankConfig returned no communicator");
    {
      nccl_handle h = std::exchange(building, nullptr);  // finish_or_abort aborts it on failure
      finish_or_abort(*api_, h, deadline, poll, timeout, "ncclCommInitRankConfig");
      building = h;
    }
    auto result = make(std::exchange(building, nullptr), request.epoch);
    return done(nccl_path::fresh_init, std::move(result));
  } catch (...) {
    abort_all();
    throw;
  }
}

namespace detail {
// src/comm/registry.cpp: registers a built-in without replacing a backend the user registered
// under its name.
void register_builtin_backend(const std::string& name, backend_factory factory);
}  // namespace detail

void register_nccl_backend() {
  detail::register_builtin_backend("nccl", [](const backend_config& config) {
    nccl_backend_options o;
    o.key_prefix = config.key_prefix + "/nccl";
    auto api = load_nccl_api();
    if (!api->host_memory()) {
      // The process's current CUDA device (torch.cuda.set_device(local_rank) before the controller).
      const bool cuda = c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA) &&
                        c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->deviceCount() > 0;
      if (!cuda)
        throw comm_error(
            "backend 'nccl' needs a CUDA GPU and a CUDA build of torch (none here); use 'gloo' on CPUs, or set "
            "DRA_NCCL_EMULATION=1 to run the protocol on the emulated NCCL library (CPU tensors)");
      o.device = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index();
    }
    return std::make_shared<nccl_backend>(std::move(api), o);
  });
}

}  // namespace dra::comm
