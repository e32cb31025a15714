#pragma once
// The watchdog of one NCCL communicator (internal to dra::dra). NCCL does not fail when a peer
// dies or hangs: its kernels wait (over shared memory or NVLink, forever). Every operation of the
// communicator is therefore tracked here, with a deadline:
//   * work enqueued on a CUDA stream: an event recorded after it, queried from this thread;
//   * a call that runs in the caller's thread (the emulated library, or an enqueue that blocks):
//     the call itself, from begin_call to end_call.
// While anything is outstanding the thread also polls ncclCommGetAsyncError. When a deadline
// passes or an asynchronous error shows, it faults the communicator once (the fault callback:
// revoke on NCCL >= 2.28, else abort), which ends the hung work; the owner learns it at its next
// call (fired()) and hands over to the elastic world's recovery. The thread starts with the first
// tracked operation and sleeps when nothing is outstanding.
#include <c10/core/Event.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "dra/torch/comm/nccl.hpp"

namespace dra::comm::nccl_detail {

class nccl_watchdog {
 public:
  /// `probe` polls the communicator's asynchronous error (success or in_progress: fine);
  /// `fault(why)` revokes or aborts it (called once, from the watchdog's thread).
  using probe_fn = std::function<nccl_result()>;
  using fault_fn = std::function<void(const std::string& why)>;
  nccl_watchdog(std::chrono::milliseconds timeout, probe_fn probe, fault_fn fault);
  ~nccl_watchdog();
  nccl_watchdog(const nccl_watchdog&) = delete;
  nccl_watchdog& operator=(const nccl_watchdog&) = delete;

  /// A call that may block the calling thread; end_call(token) when it returned.
  std::uint64_t begin_call(const char* what);
  void end_call(std::uint64_t token);
  /// Work enqueued on a device stream, complete once `event` is.
  void track(c10::Event event, const char* what);
  /// Whether every tracked operation completed (events queried now).
  bool idle();
  /// Whether the watchdog faulted the communicator, and why.
  bool fired() const;
  std::string reason() const;
  void set_timeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds timeout() const;

 private:
  struct pending {
    std::uint64_t token;
    std::string what;
    std::chrono::steady_clock::time_point deadline;
    std::optional<c10::Event> event;  // none: a call in the caller's thread
  };
  void run();
  void start_locked();
  void fire_locked(std::unique_lock<std::mutex>& lock, const std::string& why);

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::list<pending> pending_;
  std::chrono::milliseconds timeout_;
  probe_fn probe_;
  fault_fn fault_;
  std::uint64_t next_token_ = 1;
  bool fired_ = false;
  bool stop_ = false;
  std::string reason_;
  std::thread thread_;
};

}  // namespace dra::comm::nccl_detail
