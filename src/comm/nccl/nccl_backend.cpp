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

#include "dra/torch/comm/nccl.hpp"
#include "dra/error.hpp"

namespace dra::comm {
namespace {

using clock_type = std::chrono::steady_clock;

enum class wait_outcome { ready, failed, timed_out };

std::chrono::milliseconds remaining(clock_type::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
  // c10d treats a zero timeout as "wait forever": never pass one.
  return std::max(left, std::chrono::milliseconds(1));
}

/// Polls ncclCommGetAsyncError until the communicator leaves ncclInProgress, or the deadline.
wait_outcome wait_ready(nccl_api& api, nccl_handle comm, clock_type::time_point deadline,
                        std::chrono::milliseconds poll, nccl_result* error) {
  auto sleep = std::max(poll, std::chrono::milliseconds(1));
  const auto max_sleep = sleep * 16;
  for (;;) {
    nccl_result state = nccl_result::success;
    const auto r = api.comm_get_async_error(comm, &state);
    if (r != nccl_result::success) state = r;
    if (state == nccl_result::success) return wait_outcome::ready;
    if (state != nccl_result::in_progress) {
      if (error) *error = state;
      return wait_outcome::failed;
    }
    const auto now = clock_type::now();
    if (now >= deadline) return wait_outcome::timed_out;
    std::this_thread::sleep_for(std::min<clock_type::duration>(sleep, deadline - now));
    sleep = std::min(sleep * 2, max_sleep);
  }
}

std::string describe(const nccl_api& api, nccl_handle comm, nccl_result r) {
  std::string s = api.error_string(r);
  if (comm) {
    const auto last = api.last_error(comm);
    if (!last.empty()) s += " (" + last + ")";
  }
  return s;
}

/// Waits for a communicator being built; on failure aborts it and throws.
void finish_or_abort(nccl_api& api, nccl_handle comm, clock_type::time_point deadline, std::chrono::milliseconds poll,
                     std::chrono::milliseconds timeout, const std::string& what) {
  nccl_result error = nccl_result::success;
  const auto outcome = wait_ready(api, comm, deadline, poll, &error);
  if (outcome == wait_outcome::ready) return;
  const auto message = outcome == wait_outcome::failed ? describe(api, comm, error) : std::string();
  api.comm_abort(comm);
  if (outcome == wait_outcome::timed_out)
    throw timeout_error(what + " did not complete within " + std::to_string(timeout.count()) +
                        " ms; the communicator was aborted");
  throw comm_error(what + " failed: " + message + "; the communicator was aborted");
}

/// Fixed teardown order: finalize (bounded) -> destroy; failure or timeout -> abort. With
/// `with_abort` (after a fault or an abortive shrink) only abort.
void release_handle(nccl_api& api, nccl_handle comm, bool with_abort, std::chrono::milliseconds timeout,
                    std::chrono::milliseconds poll) noexcept {
  if (!comm) return;
  try {
    if (!with_abort) {
      const auto r = api.comm_finalize(comm);
      if ((r == nccl_result::success || r == nccl_result::in_progress) &&
          wait_ready(api, comm, clock_type::now() + timeout, poll, nullptr) == wait_outcome::ready) {
        detail::log_check(api.comm_destroy(comm) == nccl_result::success, "ncclCommDestroy");
        return;
      }
    }
    api.comm_abort(comm);
  } catch (...) {
    detail::log_check(false, "NCCL communicator teardown threw");
  }
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

/// Sets the CUDA device for the NCCL calls of a scope (NCCL binds a communicator to the current
/// device at creation), through torch's device guard so dra needs no CUDA runtime of its own.
class device_scope {
 public:
  explicit device_scope(int device) {
    if (device >= 0) guard_.emplace(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
  }

 private:
  std::optional<c10::DeviceGuard> guard_;
};

nccl_dtype dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return nccl_dtype::float32;
    case at::kDouble:
      return nccl_dtype::float64;
    case at::kHalf:
      return nccl_dtype::float16;
    case at::kBFloat16:
      return nccl_dtype::bfloat16;
    case at::kInt:
      return nccl_dtype::int32;
    case at::kLong:
      return nccl_dtype::int64;
    case at::kChar:
      return nccl_dtype::int8;
    case at::kByte:
      return nccl_dtype::uint8;
    default:
      break;
  }
  throw std::invalid_argument(std::string("tensor dtype: ") + c10::toString(t.scalar_type()) +
                              " is not supported by the NCCL backend; use a float, half, bfloat16 or integer tensor");
}

void* current_stream(const at::Tensor& t) {
  const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return impl->getStream(t.device()).native_handle();
}

}  // namespace

// ---- communicator -----------------------------------------------------------------------------

nccl_communicator::nccl_communicator(std::shared_ptr<nccl_api> api, nccl_handle handle, int rank, int size,
                                     std::uint64_t epoch, int device, std::chrono::milliseconds timeout,
                                     std::chrono::milliseconds poll_interval)
    : api_(std::move(api)),
      handle_(handle),
      rank_(rank),
      size_(size),
      epoch_(epoch),
      device_(device),
      timeout_(timeout),
      poll_interval_(poll_interval) {}

nccl_communicator::~nccl_communicator() {
  // A revoked communicator may not be finalized (NCCL): abort it.
  release_handle(*api_, release(), revoked_, timeout_, poll_interval_);
}

nccl_handle nccl_communicator::release() noexcept {
  return std::exchange(handle_, nullptr);
}

void nccl_communicator::abort() noexcept {
  if (auto h = release()) {
    detail::log_check(api_->comm_abort(h) == nccl_result::success, "ncclCommAbort");
  }
}

void nccl_communicator::fault() noexcept {
  // Revoke keeps the communicator shrinkable (an abortive shrink can follow); without it, abort.
  if (handle_ && !revoked_ && api_->features().revoke() && api_->comm_revoke(handle_) == nccl_result::success) {
    revoked_ = true;
    return;
  }
  abort();
}

void nccl_communicator::check_enqueued(nccl_result result, const char* what) {
  if (result == nccl_result::success) return;
  nccl_result error = result;
  if (result == nccl_result::in_progress) {
    // Non-blocking communicators may return while the enqueue is still in progress.
    const auto outcome = wait_ready(*api_, handle_, clock_type::now() + timeout_, poll_interval_, &error);
    if (outcome == wait_outcome::ready) return;
    if (outcome == wait_outcome::timed_out) {
      fault();
      throw timeout_error(std::string(what) + " was not enqueued within " + std::to_string(timeout_.count()) +
                          " ms; the communicator was revoked/aborted");
    }
  }
  const auto message = describe(*api_, handle_, error);
  fault();
  throw comm_error(std::string(what) + " failed: " + message + "; the communicator was revoked/aborted");
}

namespace {
void check_usable(const nccl_communicator& c, const at::Tensor& t, const char* what) {
  if (!c.handle() || c.revoked())
    throw comm_error(std::string(what) + ": the NCCL communicator was aborted or revoked; rebuild it first");
  if (!t.is_cuda())
    throw std::invalid_argument(std::string(what) + " tensor: NCCL needs a CUDA tensor; move it with .cuda()");
  if (!t.is_contiguous())
    throw std::invalid_argument(std::string(what) + " tensor: must be contiguous; call .contiguous() first");
  if (c.device() >= 0 && t.get_device() != c.device())
    throw std::invalid_argument(std::string(what) + " tensor: on cuda:" + std::to_string(t.get_device()) +
                                " but the communicator is on cuda:" + std::to_string(c.device()));
}
}  // namespace

void nccl_communicator::all_reduce_sum(at::Tensor& tensor) {
  check_usable(*this, tensor, "all_reduce_sum");
  const auto dtype = dtype_of(tensor);
  device_scope scope(tensor.get_device());
  void* data = tensor.data_ptr();
  check_enqueued(api_->all_reduce_sum(data, data, static_cast<std::size_t>(tensor.numel()), dtype, handle_,
                                      current_stream(tensor)),
                 "ncclAllReduce");
}

void nccl_communicator::broadcast(at::Tensor& tensor, int root) {
  if (root < 0 || root >= size_)
    throw std::invalid_argument("broadcast root: " + std::to_string(root) + " is not a rank of this world of " +
                                std::to_string(size_));
  check_usable(*this, tensor, "broadcast");
  const auto dtype = dtype_of(tensor);
  device_scope scope(tensor.get_device());
  void* data = tensor.data_ptr();
  check_enqueued(api_->broadcast(data, data, static_cast<std::size_t>(tensor.numel()), dtype, root, handle_,
                                 current_stream(tensor)),
                 "ncclBroadcast");
}

void nccl_communicator::barrier() {
  const int device = device_ >= 0 ? device_ : 0;
  auto token = at::zeros(
      {1}, at::TensorOptions().dtype(at::kFloat).device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device))));
  all_reduce_sum(token);
  const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  const auto stream = impl->getStream(token.device());
  const auto deadline = clock_type::now() + timeout_;
  auto sleep = std::max(poll_interval_, std::chrono::milliseconds(1));
  // Poll instead of synchronising: a peer that never arrives must end in a timeout, not a hang.
  while (!impl->queryStream(stream)) {
    nccl_result state = nccl_result::success;
    api_->comm_get_async_error(handle_, &state);
    if (state != nccl_result::success && state != nccl_result::in_progress) {
      const auto message = describe(*api_, handle_, state);
      fault();
      throw comm_error("barrier failed: " + message + "; the communicator was revoked/aborted");
    }
    if (clock_type::now() >= deadline) {
      fault();
      throw timeout_error("barrier did not complete within " + std::to_string(timeout_.count()) +
                          " ms; the communicator was revoked/aborted");
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::milliseconds(16));
  }
}

// ---- backend ----------------------------------------------------------------------------------

nccl_backend::nccl_backend(std::shared_ptr<nccl_api> api, nccl_backend_options options)
    : api_(std::move(api)), options_(std::move(options)) {
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
    const auto ms = std::chrono::duration<double, std::milli>(clock_type::now() - started).count();
    std::ostringstream f;
    f << ",\"path\":\"" << to_string(path) << "\",\"rank\":" << plan.new_rank << ",\"ms\":" << ms;
    log("nccl_rebuild_done", f.str());
    return result;
  };
  auto make = [&](nccl_handle h, std::uint64_t epoch) {
    return std::make_unique<nccl_communicator>(api_, h, plan.new_rank, plan.new_size, epoch, options_.device, timeout,
                                               poll);
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
    // A first init needs no vote: every member plans it from the request alone.
    const bool vote = !request.old_members.empty();
    if (vote && !unanimous(*store, base + "/vote_fast", plan.new_size, fast, deadline, timeout) && fast) {
      log("nccl_rebuild_fallback", ",\"from\":\"" + std::string(to_string(plan.path)) +
                                       "\",\"reason\":\"another member cannot take this path\"");
      fast = false;
    }
    if (fast && plan.path == nccl_path::keep) {
      parent->epoch_ = request.epoch;
      parent->timeout_ = timeout;
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

void register_nccl_backend() {
  register_backend("nccl", [](const backend_config& config) {
    nccl_backend_options o;
    o.key_prefix = config.key_prefix + "/nccl";
    return std::make_shared<nccl_backend>(load_nccl_api(), o);
  });
}

}  // namespace dra::comm
