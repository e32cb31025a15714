#pragma once
// Gloo backend of the communicator interface (CPU tensors). One c10d::ProcessGroupGloo per world
// epoch, rendezvoused through PrefixStore("dra/epoch/<epoch>", store) over the job's c10d store,
// with the request's timeout as the Gloo timeout, so a dead or hung peer raises
// dra::timeout_error / dra::comm_error instead of blocking.
//
// This header needs no Gloo headers: the group is held as a c10d::Backend. Only src/comm/gloo/gloo_backend.cpp
// includes ProcessGroupGloo.hpp (and through it the Gloo headers of libgloo-dev); it only calls
// what libtorch itself compiles (constructor, static factories, virtual methods), so the Gloo
// version of the headers never decides an object layout that libtorch's Gloo relies on.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

// communicator.hpp returns intrusive_ptr<c10d::Backend> from an inline virtual, which needs the
// complete type in every translation unit that defines a derived class.
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "dra/torch/comm/communicator.hpp"

namespace dra::comm {

namespace detail {
class gloo_reaper;
class rendezvous_keys;
}  // namespace detail

struct gloo_backend_options {
  /// Address the Gloo device binds to and announces to peers (e.g. "127.0.0.1" on one host).
  /// Empty: `interface` if set, else GLOO_SOCKET_IFNAME, else c10d's default device (this
  /// machine's hostname, falling back to loopback).
  std::string hostname;
  /// Network interface name (e.g. "eth0"); used when `hostname` is empty.
  std::string interface;
  /// Store keys of an epoch's rendezvous live under <key_prefix>/<epoch>/.
  std::string key_prefix = "dra/epoch";
};

/// A communicator of one epoch: synchronous collectives on CPU tensors, each bounded by the
/// request's collective timeout.
class gloo_communicator final : public communicator {
 public:
  gloo_communicator(c10::intrusive_ptr<c10d::Backend> group, int rank, int size, std::uint64_t epoch,
                    std::chrono::milliseconds timeout, std::shared_ptr<detail::gloo_reaper> reaper);
  ~gloo_communicator() override;
  gloo_communicator(const gloo_communicator&) = delete;
  gloo_communicator& operator=(const gloo_communicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::uint64_t epoch() const override { return epoch_; }
  /// Sum over the world, in place; returns when done. Throws dra::timeout_error after the
  /// timeout, dra::comm_error on any other failure (a peer closed its connection, ...).
  void all_reduce_sum(at::Tensor& tensor) override;
  void broadcast(at::Tensor& tensor, int root) override;
  void barrier() override;
  void send(const at::Tensor& tensor, const std::vector<int>& dsts, int tag) override;
  void recv(at::Tensor& tensor, int src, int tag) override;
  void send_batch(const std::vector<at::Tensor>& tensors, const std::vector<int>& dsts, int first_tag) override;
  void recv_batch(const std::vector<at::Tensor>& tensors, int src, int first_tag) override;
  /// Hands the group to a background reaper (its teardown may wait for in-flight Gloo work to
  /// hit the Gloo timeout); returns at once. Collectives throw dra::comm_error afterwards.
  void abort() noexcept override;
  c10::intrusive_ptr<c10d::Backend> c10d_backend() const override { return group_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// Bound of every later collective (set from the rebuild request's collective_timeout, which
  /// lets a job rendezvous generously and still detect a hung peer fast). After a timeout_error
  /// the group may still be busy: rebuild abortively. Throws std::invalid_argument for a
  /// timeout <= 0.
  void set_timeout(std::chrono::milliseconds timeout);

 private:
  template <class Start>
  void run(const char* what, Start&& start);
  template <class Post>
  void post_all(const char* what, const std::vector<at::Tensor>& tensors, Post&& post);
  void check_peer(int peer, const char* field) const;

  c10::intrusive_ptr<c10d::Backend> group_;
  int rank_;
  int size_;
  std::uint64_t epoch_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<detail::gloo_reaper> reaper_;
};

/// The Gloo backend: the rebuild routine (see src/comm/gloo/gloo_backend.cpp for every case it handles).
/// Every rebuild call needs an epoch not used before with the same key prefix and store.
class gloo_backend final : public backend {
 public:
  explicit gloo_backend(gloo_backend_options options = {});
  /// Groups discarded by abortive rebuilds finish their teardown (each bounded by its Gloo
  /// timeout) in background threads, joined once this backend and its communicators are gone.
  ~gloo_backend() override;
  std::string name() const override { return "gloo"; }
  std::unique_ptr<communicator> rebuild(std::unique_ptr<communicator> current, const rebuild_request& request,
                                        const c10::intrusive_ptr<c10d::Store>& store) override;
  const gloo_backend_options& options() const { return options_; }

 private:
  gloo_backend_options options_;
  std::shared_ptr<detail::gloo_reaper> reaper_;
  std::shared_ptr<detail::rendezvous_keys> keys_;  // this process's rendezvous keys, erased two worlds later
};

}  // namespace dra::comm
