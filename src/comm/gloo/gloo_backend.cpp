#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dra/torch/comm/gloo.hpp"

// ProcessGroupGloo.hpp is compiled out unless USE_C10D_GLOO is defined; the torch wheels are
// built with Gloo, and its Gloo headers come from libgloo-dev (scripts/setup.sh). Defined here,
// not in CMake, so that only this translation unit sees the Gloo headers.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <ATen/Functions.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "../descriptors.hpp"
#include "../rendezvous_keys.hpp"
#include "dra/elastic/membership.hpp"
#include "dra/error.hpp"

namespace dra::comm {

namespace detail {

/// Tears discarded groups down off the caller's thread. ~ProcessGroupGloo waits for its queued
/// work, and in-flight work on a group with a dead or hung peer only ends at the Gloo timeout:
/// an abortive rebuild must not wait for that. The reaper lives as long as the backend and every
/// communicator it made; its destructor joins the teardown threads.
class gloo_reaper {
 public:
  ~gloo_reaper() {
    std::vector<entry> entries;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      entries.swap(entries_);
    }
    for (auto& e : entries)
      if (e.thread.joinable()) e.thread.join();
  }

  void discard(c10::intrusive_ptr<c10d::Backend> group) noexcept {
    if (!group) return;
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      // Join the teardowns that already finished, so a long job does not accumulate threads.
      for (auto it = entries_.begin(); it != entries_.end();) {
        if (it->done->load()) {
          it->thread.join();
          it = entries_.erase(it);
        } else {
          ++it;
        }
      }
      auto done = std::make_shared<std::atomic<bool>>(false);
      std::thread t([g = std::move(group), done]() mutable {
        try {
          g.reset();
        } catch (const std::exception& e) {
          dra::detail::log_check(false, e.what());
        }
        done->store(true);
      });
      entries_.push_back({std::move(t), std::move(done)});
    } catch (const std::exception& e) {
      // No thread could be started: the group is released on this thread when `group` goes out
      // of scope (it may then wait for the Gloo timeout), which is still bounded.
      dra::detail::log_check(false, e.what());
    }
  }

 private:
  struct entry {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::mutex mutex_;
  std::vector<entry> entries_;
};

}  // namespace detail

namespace {

bool mentions_timeout(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text.find("timed out") != std::string::npos || text.find("timeout") != std::string::npos;
}

[[noreturn]] void rethrow_as_dra_error(const std::exception& e, const std::string& what, std::uint64_t epoch) {
  const std::string text = e.what();
  // c10 errors carry a C++ backtrace after the first line: keep the message readable.
  const std::string msg =
      what + " in world epoch " + std::to_string(epoch) + " failed: " + text.substr(0, text.find('\n'));
  if (mentions_timeout(text)) throw dra::timeout_error(msg);
  throw dra::comm_error(msg);
}

void check_members(const std::vector<int>& ids, const char* field) {
  std::set<int> seen;
  for (int id : ids) {
    if (id < 0) dra::detail::throw_invalid(field, "universe ids must be >= 0, got " + std::to_string(id));
    if (!seen.insert(id).second)
      dra::detail::throw_invalid(field, "universe id " + std::to_string(id) + " appears twice; list each member once");
  }
}

void validate(const rebuild_request& r, const communicator* current, const c10::intrusive_ptr<c10d::Store>& store) {
  if (!store) dra::detail::throw_invalid("store", "a c10d store is required for the Gloo rendezvous");
  check_members(r.old_members, "old_members");
  check_members(r.new_members, "new_members");
  if (r.new_members.empty()) dra::detail::throw_invalid("new_members", "the new world must have at least one member");
  if (r.self < 0) dra::detail::throw_invalid("self", "must be this process's universe id (>= 0)");
  if (r.timeout.count() <= 0) dra::detail::throw_invalid("timeout", "must be > 0 ms");
  if (r.collective_timeout.count() < 0)
    dra::detail::throw_invalid("collective_timeout", "must be >= 0 ms (0: the rendezvous timeout)");
  const int old_rank = dra::elastic::rank_of(r.old_members, r.self);
  const int new_rank = dra::elastic::rank_of(r.new_members, r.self);
  if (old_rank < 0 && new_rank < 0)
    dra::detail::throw_invalid("self", "universe id " + std::to_string(r.self) +
                                           " is in neither old_members nor new_members; pass this process's id");
  if (current != nullptr) {
    if (old_rank < 0)
      dra::detail::throw_invalid("current",
                                 "a communicator was passed but self is not in old_members; a joiner passes null");
    if (current->rank() != old_rank || current->size() != static_cast<int>(r.old_members.size()))
      dra::detail::throw_invalid("old_members",
                                 "rank/size of the current communicator (" + std::to_string(current->rank()) + "/" +
                                     std::to_string(current->size()) + ") do not match self's position in old_members");
    if (r.epoch <= current->epoch())
      dra::detail::throw_invalid("epoch", "must exceed the current epoch " + std::to_string(current->epoch()) +
                                              " (each world needs its own rendezvous keys)");
  } else if (old_rank >= 0) {
    dra::detail::throw_invalid("current",
                               "self is a member of old_members but no communicator was passed; pass the old one");
  }
}

std::shared_ptr<::gloo::transport::Device> make_device(const gloo_backend_options& o) {
  if (!o.hostname.empty()) return c10d::ProcessGroupGloo::createDeviceForHostname(o.hostname);
  if (!o.interface.empty()) return c10d::ProcessGroupGloo::createDeviceForInterface(o.interface);
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname != '\0')
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

void check_cpu_tensor(const at::Tensor& t) {
  if (!t.defined()) dra::detail::throw_invalid("tensor", "is undefined");
  if (!t.device().is_cpu())
    dra::detail::throw_invalid("tensor", "the Gloo backend takes CPU tensors; move it with .cpu()");
  if (t.is_sparse()) dra::detail::throw_invalid("tensor", "must be dense");
}

}  // namespace

gloo_communicator::gloo_communicator(c10::intrusive_ptr<c10d::Backend> group, int rank, int size, std::uint64_t epoch,
                                     std::chrono::milliseconds timeout, std::shared_ptr<detail::gloo_reaper> reaper)
    : group_(std::move(group)),
      rank_(rank),
      size_(size),
      epoch_(epoch),
      timeout_(timeout),
      reaper_(std::move(reaper)) {}

gloo_communicator::~gloo_communicator() = default;

template <class Start>
void gloo_communicator::run(const char* what, Start&& start) {
  if (!group_)
    throw dra::comm_error(std::string(what) + ": the communicator of epoch " + std::to_string(epoch_) + " was aborted");
  try {
    auto work = start();
    // Gloo's own timeout also ends the collective on the worker thread; this bounds the wait.
    work->wait(timeout_);
  } catch (const dra::error&) {
    throw;
  } catch (const std::exception& e) {
    rethrow_as_dra_error(e, what, epoch_);
  }
}

void gloo_communicator::all_reduce_sum(at::Tensor& tensor) {
  check_cpu_tensor(tensor);
  // Gloo reduces contiguous buffers: a strided view is reduced through a contiguous copy.
  std::vector<at::Tensor> v{tensor.is_contiguous() ? tensor : tensor.contiguous()};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  opts.timeout = timeout_;
  run("all_reduce_sum", [&] { return group_->allreduce(v, opts); });
  if (!v[0].is_same(tensor)) tensor.copy_(v[0]);
}

void gloo_communicator::broadcast(at::Tensor& tensor, int root) {
  if (root < 0 || root >= size_)
    dra::detail::throw_invalid("root", "must lie in [0, " + std::to_string(size_) + "), got " + std::to_string(root));
  check_cpu_tensor(tensor);
  std::vector<at::Tensor> v{tensor.is_contiguous() ? tensor : tensor.contiguous()};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.rootTensor = 0;
  opts.timeout = timeout_;
  run("broadcast", [&] { return group_->broadcast(v, opts); });
  if (!v[0].is_same(tensor)) tensor.copy_(v[0]);
}

void gloo_communicator::barrier() {
  c10d::BarrierOptions opts;
  opts.timeout = timeout_;
  run("barrier", [&] { return group_->barrier(opts); });
}

void gloo_communicator::send(const at::Tensor& tensor, const std::vector<int>& dsts, int tag) {
  check_cpu_tensor(tensor);
  send_batch({tensor.is_contiguous() ? tensor : tensor.contiguous()}, dsts, tag);
}

void gloo_communicator::recv(at::Tensor& tensor, int src, int tag) {
  recv_batch({tensor}, src, tag);
}

void gloo_communicator::check_peer(int peer, const char* field) const {
  if (peer < 0 || peer >= size_ || peer == rank_)
    dra::detail::throw_invalid(field, "ranks must lie in [0, " + std::to_string(size_) + ") and differ from self (" +
                                          std::to_string(rank_) + "), got " + std::to_string(peer));
}

template <class Post>
void gloo_communicator::post_all(const char* what, const std::vector<at::Tensor>& tensors, Post&& post) {
  for (const auto& t : tensors) {
    check_cpu_tensor(t);
    if (!t.is_contiguous()) dra::detail::throw_invalid("tensors", std::string(what) + " needs contiguous tensors");
  }
  if (!group_)
    throw dra::comm_error(std::string(what) + ": the communicator of epoch " + std::to_string(epoch_) + " was aborted");
  try {
    // Everything is posted before anything is waited for: the pieces stream back to back, and
    // several receivers are served in parallel.
    std::vector<std::vector<at::Tensor>> holders;
    holders.reserve(tensors.size());
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      holders.push_back({tensors[i]});
      post(holders.back(), static_cast<int>(i), works);
    }
    for (auto& w : works) w->wait(timeout_);
  } catch (const dra::error&) {
    throw;
  } catch (const std::exception& e) {
    rethrow_as_dra_error(e, what, epoch_);
  }
}

void gloo_communicator::send_batch(const std::vector<at::Tensor>& tensors, const std::vector<int>& dsts,
                                   int first_tag) {
  for (int d : dsts) check_peer(d, "dsts");
  post_all("send", tensors, [&](std::vector<at::Tensor>& t, int i, std::vector<c10::intrusive_ptr<c10d::Work>>& works) {
    for (int d : dsts) works.push_back(group_->send(t, d, first_tag + i));
  });
}

void gloo_communicator::recv_batch(const std::vector<at::Tensor>& tensors, int src, int first_tag) {
  check_peer(src, "src");
  post_all("recv", tensors, [&](std::vector<at::Tensor>& t, int i, std::vector<c10::intrusive_ptr<c10d::Work>>& works) {
    works.push_back(group_->recv(t, src, first_tag + i));
  });
}

void gloo_communicator::set_timeout(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) dra::detail::throw_invalid("timeout", "must be > 0 ms");
  timeout_ = timeout;
}

void gloo_communicator::abort() noexcept {
  if (!group_) return;
  try {
    group_->abort();  // a no-op for Gloo in torch 2.13; kept for backends that implement it
  } catch (const std::exception& e) {
    dra::detail::log_check(false, e.what());
  }
  if (reaper_) {
    reaper_->discard(std::move(group_));
  }
  group_.reset();
}

gloo_backend::gloo_backend(gloo_backend_options options)
    : options_(std::move(options)),
      reaper_(std::make_shared<detail::gloo_reaper>()),
      keys_(std::make_shared<detail::rendezvous_keys>()) {}

gloo_backend::~gloo_backend() = default;

std::unique_ptr<communicator> gloo_backend::rebuild(std::unique_ptr<communicator> current,
                                                    const rebuild_request& request,
                                                    const c10::intrusive_ptr<c10d::Store>& store) {
  // Cases handled (every one ends with a fresh group or null; Gloo has no grow, and its shrink
  // needs the parent alive and cannot admit joiners, so a new group per epoch covers them all):
  //  * bad request (self in neither list, duplicate/negative ids, empty new world, stale epoch,
  //    a communicator that does not match old_members, no store): std::invalid_argument before
  //    anything is touched; `current` is then destroyed with this call's arguments.
  //  * first init (old_members empty, current null): build the group of new_members.
  //  * shrink (voluntary): the old group is idle at a step boundary and is released here; the
  //    survivors are renumbered by their position in new_members.
  //  * grow (voluntary): members release the old group, joiners (current null, self only in
  //    new_members) have nothing to tear down; all rendezvous in the new epoch's prefix.
  //  * abortive change (a member died or hung): the old group is aborted and handed to the
  //    reaper, which tears it down off this thread, so the rebuild never waits on the old group.
  //  * leaver (self not in new_members): the old group is released (or reaped, if abortive);
  //    returns null.
  //  * a failed rendezvous (a new member never arrives): dra::timeout_error after the timeout,
  //    other c10d failures: dra::comm_error.
  validate(request, current.get(), store);
  if (current) {
    // A voluntary change happens at a step boundary: nothing is in flight, so releasing the old
    // group here is immediate. An abortive one hands it to the reaper instead.
    if (request.abortive) current->abort();
    current.reset();
  }
  const int rank = dra::elastic::rank_of(request.new_members, request.self);
  if (rank < 0) return nullptr;
  const int size = static_cast<int>(request.new_members.size());
  try {
    auto prefixed =
        c10::make_intrusive<c10d::PrefixStore>(options_.key_prefix + "/" + std::to_string(request.epoch), store);
    auto options = c10d::ProcessGroupGloo::Options::create(request.timeout);
    options->devices.push_back(make_device(options_));
    auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, options);
    // This rank's address, written by Gloo's rendezvous under the device's index (one device: 0).
    keys_->built({options_.key_prefix + "/" + std::to_string(request.epoch) + "/0/" + std::to_string(rank)}, store);
    // The rendezvous had the generous timeout; every collective afterwards gets the short one.
    const auto collective = request.collective_timeout.count() > 0 ? request.collective_timeout : request.timeout;
    return std::make_unique<gloo_communicator>(std::move(group), rank, size, request.epoch, collective, reaper_);
  } catch (const dra::error&) {
    throw;
  } catch (const std::exception& e) {
    // Out of file descriptors, Gloo says something else ("Cannot resolve 127.0.0.1 to a (local)
    // address"): the message names the limit instead.
    if (const auto why = dra::detail::out_of_descriptors())
      throw dra::comm_error("building the Gloo world of " + std::to_string(size) + " ranks in world epoch " +
                            std::to_string(request.epoch) + " failed: " + *why +
                            " (Gloo: " + std::string(e.what()).substr(0, std::string(e.what()).find('\n')) + ")");
    rethrow_as_dra_error(e, "building the Gloo world of " + std::to_string(size) + " ranks", request.epoch);
  }
}

namespace detail {
// src/comm/registry.cpp: registers a built-in without replacing a backend the user registered
// under its name.
void register_builtin_backend(const std::string& name, backend_factory factory);
}  // namespace detail

void register_gloo_backend() {
  detail::register_builtin_backend("gloo", [](const backend_config& config) {
    gloo_backend_options o;
    o.hostname = config.address;
    o.key_prefix = config.key_prefix;
    return std::make_shared<gloo_backend>(o);
  });
}

}  // namespace dra::comm
