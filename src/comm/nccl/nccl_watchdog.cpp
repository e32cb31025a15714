// The watchdog of one NCCL communicator (nccl_watchdog.hpp).
#include "nccl_watchdog.hpp"

#include <algorithm>

namespace dra::comm::nccl_detail {

namespace {
// How often outstanding device events and the asynchronous error are looked at. A hung peer is
// reported within the timeout plus this.
constexpr std::chrono::milliseconds kPoll{2};
}  // namespace

nccl_watchdog::nccl_watchdog(std::chrono::milliseconds timeout, probe_fn probe, fault_fn fault)
    : timeout_(timeout), probe_(std::move(probe)), fault_(std::move(fault)) {}

nccl_watchdog::~nccl_watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void nccl_watchdog::start_locked() {
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
}

std::uint64_t nccl_watchdog::begin_call(const char* what) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto token = next_token_++;
  pending_.push_back({token, what, std::chrono::steady_clock::now() + timeout_, std::nullopt});
  start_locked();
  wake_.notify_all();
  return token;
}

void nccl_watchdog::end_call(std::uint64_t token) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.remove_if([token](const pending& p) { return p.token == token; });
}

void nccl_watchdog::track(c10::Event event, const char* what) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fired_) return;
  pending_.push_back({next_token_++, what, std::chrono::steady_clock::now() + timeout_, std::move(event)});
  start_locked();
  wake_.notify_all();
}

bool nccl_watchdog::idle() {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.remove_if([](const pending& p) { return p.event && p.event->query(); });
  return pending_.empty();
}

bool nccl_watchdog::fired() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return fired_;
}

std::string nccl_watchdog::reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reason_;
}

void nccl_watchdog::set_timeout(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  timeout_ = timeout;
}

std::chrono::milliseconds nccl_watchdog::timeout() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return timeout_;
}

void nccl_watchdog::fire_locked(std::unique_lock<std::mutex>& lock, const std::string& why) {
  fired_ = true;
  reason_ = why;
  pending_.clear();
  // Outside the lock: an abort of the emulated library waits for the blocked call to leave, and
  // that call's end_call takes the lock.
  lock.unlock();
  fault_(why);
  lock.lock();
}

void nccl_watchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  auto next_probe = std::chrono::steady_clock::now();
  while (!stop_) {
    if (pending_.empty() || fired_) {
      wake_.wait(lock, [this] { return stop_ || (!pending_.empty() && !fired_); });
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    bool device_work = false;
    std::string overdue;
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->event && it->event->query()) {
        it = pending_.erase(it);
        continue;
      }
      device_work = device_work || it->event.has_value();
      if (overdue.empty() && now >= it->deadline)
        overdue =
            it->what + " did not complete within " + std::to_string(timeout_.count()) + " ms (a peer is gone or hung)";
      ++it;
    }
    if (!overdue.empty()) {
      fire_locked(lock, overdue);
      continue;
    }
    if (pending_.empty()) continue;
    if (now >= next_probe) {
      next_probe = now + 5 * kPoll;
      lock.unlock();
      const nccl_result state = probe_();
      lock.lock();
      if (state != nccl_result::success && state != nccl_result::in_progress && !fired_ && !pending_.empty()) {
        fire_locked(lock, "asynchronous NCCL error " + std::to_string(static_cast<int>(state)));
        continue;
      }
    }
    // Device events need polling; a call in the caller's thread only needs its deadline.
    auto until = now + kPoll;
    if (!device_work) {
      until = next_probe;
      for (const auto& p : pending_) until = std::min(until, p.deadline);
    }
    wake_.wait_until(lock, until);
  }
}

}  // namespace dra::comm::nccl_detail
