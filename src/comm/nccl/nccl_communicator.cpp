// The NCCL communicator of one epoch (include/dra/torch/comm/nccl.hpp): collectives and
// point-to-point calls on the tensor's current stream, every one watched by the communicator's
// watchdog (nccl_watchdog.hpp), so that a dead or hung peer ends in an error, never in a hang.
#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <mutex>
#include <thread>

#include "dra/error.hpp"
#include "dra/torch/comm/nccl.hpp"
#include "nccl_internal.hpp"
#include "nccl_watchdog.hpp"

namespace dra::comm {

using namespace nccl_detail;

nccl_communicator::nccl_communicator(std::shared_ptr<nccl_api> api, nccl_handle handle, int rank, int size,
                                     std::uint64_t epoch, int device, std::chrono::milliseconds timeout,
                                     std::chrono::milliseconds poll_interval)
    : api_(std::move(api)),
      handle_(handle),
      rank_(rank),
      size_(size),
      epoch_(epoch),
      device_(device),
      host_memory_(api_->host_memory()),
      timeout_(timeout),
      poll_interval_(poll_interval) {
  watchdog_ = std::make_unique<nccl_watchdog>(
      timeout_,
      [this] {
        std::lock_guard<std::mutex> lock(handle_mutex_);
        nccl_result state = nccl_result::success;
        if (auto h = handle_.load()) api_->comm_get_async_error(h, &state);
        return state;
      },
      [this](const std::string&) { fault(); });
}

nccl_communicator::~nccl_communicator() {
  watchdog_.reset();  // joins its thread before the handle goes
  // A revoked communicator may not be finalized (NCCL): abort it.
  release_handle(*api_, release(), revoked_.load(), timeout_, poll_interval_);
}

nccl_handle nccl_communicator::release() noexcept {
  std::lock_guard<std::mutex> lock(handle_mutex_);
  return handle_.exchange(nullptr);
}

void nccl_communicator::abort() noexcept {
  std::lock_guard<std::mutex> lock(handle_mutex_);
  if (auto h = handle_.exchange(nullptr))
    dra::detail::log_check(api_->comm_abort(h) == nccl_result::success, "ncclCommAbort");
}

void nccl_communicator::fault() noexcept {
  std::lock_guard<std::mutex> lock(handle_mutex_);
  nccl_handle h = handle_.load();
  if (!h || revoked_.load()) return;
  // Revoke keeps the communicator shrinkable (an abortive shrink can follow); without it, abort.
  if (api_->features().revoke() && api_->comm_revoke(h) == nccl_result::success) {
    revoked_.store(true);
    return;
  }
  handle_.store(nullptr);
  dra::detail::log_check(api_->comm_abort(h) == nccl_result::success, "ncclCommAbort");
}

void nccl_communicator::revoke() noexcept {
  fault();
}

bool nccl_communicator::faulted() const {
  return watchdog_->fired();
}

void nccl_communicator::set_timeout(std::chrono::milliseconds timeout) {
  timeout_ = timeout;
  watchdog_->set_timeout(timeout);
}

at::Device nccl_communicator::device() const {
  if (host_memory_) return at::Device(at::kCPU);
  int index = device_;
  if (index < 0) index = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice().index();
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index));
}

void nccl_communicator::check_usable(const char* what) const {
  if (handle_.load() && !revoked_.load()) return;
  if (watchdog_->fired())
    throw comm_error(std::string(what) +
                     ": the communicator was revoked/aborted by its watchdog: " + watchdog_->reason());
  throw comm_error(std::string(what) + ": the NCCL communicator was aborted or revoked; rebuild it first");
}

// One NCCL call (or group): on the tensor's device, watched by the watchdog (the call itself when
// it runs in this thread, an event after it when it runs on a stream).
template <class Call>
void nccl_communicator::run(const char* what, const at::Tensor* sample, Call&& call) {
  check_usable(what);
  nccl_handle h = handle_.load();
  nccl_result r = nccl_result::success;
  if (host_memory_) {
    const auto token = watchdog_->begin_call(what);
    r = call(h);
    watchdog_->end_call(token);
  } else {
    device_scope scope(sample ? sample->get_device() : device_);
    r = call(h);
  }
  if (r == nccl_result::in_progress) {
    // A non-blocking communicator may return while the enqueue is still in progress.
    nccl_result error = r;
    const auto outcome = wait_ready(*api_, h, clock_type::now() + timeout_, poll_interval_, &error);
    r = outcome == wait_outcome::ready ? nccl_result::success : error;
    if (outcome == wait_outcome::timed_out) {
      fault();
      throw timeout_error(std::string(what) + " was not enqueued within " + std::to_string(timeout_.count()) +
                          " ms; the communicator was revoked/aborted");
    }
  }
  if (r != nccl_result::success) {
    if (watchdog_->fired())
      throw timeout_error(std::string(what) + ": " + watchdog_->reason() + "; the communicator was revoked/aborted");
    const auto message = describe(*api_, h, r);
    fault();
    throw comm_error(std::string(what) + " failed: " + message + "; the communicator was revoked/aborted");
  }
  if (!host_memory_ && sample) {
    const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    c10::Event done(c10::DeviceType::CUDA);
    done.record(impl->getStream(sample->device()));
    watchdog_->track(std::move(done), what);
  }
}

namespace {

// The buffer an NCCL call works on: the tensor itself (on the communicator's device, or any CPU
// tensor under the emulated library), else a device copy (`with_data`: holding its values).
at::Tensor staged(const nccl_communicator& c, const at::Tensor& t, const char* what, bool with_data) {
  if (!t.defined()) throw std::invalid_argument(std::string(what) + " tensor: undefined");
  const auto dtype_check = dtype_of(t);
  (void)dtype_check;
  if (c.host_memory()) {
    if (!t.device().is_cpu())
      throw std::invalid_argument(std::string(what) + " tensor: the emulated NCCL takes CPU tensors, got " +
                                  t.device().str());
    if (!t.is_contiguous())
      throw std::invalid_argument(std::string(what) + " tensor: must be contiguous; call .contiguous() first");
    return t;
  }
  const auto dev = c.device();
  if (t.is_cuda()) {
    if (t.get_device() != dev.index())
      throw std::invalid_argument(std::string(what) + " tensor: on " + t.device().str() +
                                  " but the communicator is on " + dev.str());
    if (!t.is_contiguous())
      throw std::invalid_argument(std::string(what) + " tensor: must be contiguous; call .contiguous() first");
    return t;
  }
  if (!t.device().is_cpu())
    throw std::invalid_argument(std::string(what) + " tensor: NCCL takes CUDA (or CPU, copied) tensors, got " +
                                t.device().str());
  return with_data ? t.contiguous().to(dev) : at::empty(t.sizes(), t.options().device(dev));
}

void copy_back(at::Tensor& dst, const at::Tensor& buf) {
  if (!buf.is_same(dst)) dst.copy_(buf);  // device -> CPU: waits for the stream (watchdog-bounded)
}

}  // namespace

void nccl_communicator::all_reduce_sum(at::Tensor& tensor) {
  at::Tensor buf = staged(*this, tensor, "all_reduce_sum", true);
  const auto dtype = dtype_of(buf);
  run("all_reduce_sum (ncclAllReduce)", &buf, [&](nccl_handle h) {
    return api_->all_reduce_sum(buf.data_ptr(), buf.data_ptr(), static_cast<std::size_t>(buf.numel()), dtype, h,
                                current_stream(buf));
  });
  copy_back(tensor, buf);
}

void nccl_communicator::broadcast(at::Tensor& tensor, int root) {
  if (root < 0 || root >= size_)
    throw std::invalid_argument("broadcast root: " + std::to_string(root) + " is not a rank of this world of " +
                                std::to_string(size_));
  at::Tensor buf = staged(*this, tensor, "broadcast", rank_ == root);
  const auto dtype = dtype_of(buf);
  run("broadcast (ncclBroadcast)", &buf, [&](nccl_handle h) {
    return api_->broadcast(buf.data_ptr(), buf.data_ptr(), static_cast<std::size_t>(buf.numel()), dtype, root, h,
                           current_stream(buf));
  });
  copy_back(tensor, buf);
}

void nccl_communicator::barrier() {
  at::Tensor token = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device()));
  all_reduce_sum(token);
  synchronize();
}

void nccl_communicator::synchronize() {
  // Poll instead of synchronising: a peer that never arrives ends in the watchdog's fault.
  auto sleep = std::chrono::microseconds(50);
  const auto deadline = clock_type::now() + timeout_ + std::chrono::milliseconds(100);
  while (!watchdog_->idle()) {
    if (watchdog_->fired()) break;
    if (clock_type::now() >= deadline) {
      fault();
      throw timeout_error("synchronize: work did not complete within " + std::to_string(timeout_.count()) +
                          " ms; the communicator was revoked/aborted");
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(2000));
  }
  if (watchdog_->fired())
    throw timeout_error("synchronize: " + watchdog_->reason() + "; the communicator was revoked/aborted");
}

namespace {
void check_peer(int peer, int size, int self, const char* what) {
  if (peer < 0 || peer >= size || peer == self)
    throw std::invalid_argument(std::string(what) + ": rank " + std::to_string(peer) +
                                " is not another rank of this world of " + std::to_string(size));
}
}  // namespace

void nccl_communicator::send(const at::Tensor& tensor, const std::vector<int>& dsts, int tag) {
  send_batch({tensor}, dsts, tag);
}

void nccl_communicator::recv(at::Tensor& tensor, int src, int tag) {
  recv_batch({tensor}, src, tag);
}

void nccl_communicator::send_batch(const std::vector<at::Tensor>& tensors, const std::vector<int>& dsts, int) {
  for (int d : dsts) check_peer(d, size_, rank_, "send dst");
  if (tensors.empty() || dsts.empty()) return;
  std::vector<at::Tensor> bufs;
  bufs.reserve(tensors.size());
  for (const auto& t : tensors) bufs.push_back(staged(*this, t, "send", true));
  run("send (ncclSend)", &bufs.front(), [&](nccl_handle h) {
    nccl_result r = api_->group_start();
    if (r != nccl_result::success) return r;
    for (const auto& b : bufs) {
      const auto dtype = dtype_of(b);
      for (int d : dsts) {
        r = api_->send(b.data_ptr(), static_cast<std::size_t>(b.numel()), dtype, d, h, current_stream(b));
        if (r != nccl_result::success) {
          api_->group_end();
          return r;
        }
      }
    }
    return api_->group_end();
  });
}

void nccl_communicator::recv_batch(const std::vector<at::Tensor>& tensors, int src, int) {
  check_peer(src, size_, rank_, "recv src");
  if (tensors.empty()) return;
  std::vector<at::Tensor> bufs;
  bufs.reserve(tensors.size());
  for (const auto& t : tensors) bufs.push_back(staged(*this, t, "recv", false));
  run("recv (ncclRecv)", &bufs.front(), [&](nccl_handle h) {
    nccl_result r = api_->group_start();
    if (r != nccl_result::success) return r;
    for (auto& b : bufs) {
      r = api_->recv(b.data_ptr(), static_cast<std::size_t>(b.numel()), dtype_of(b), src, h, current_stream(b));
      if (r != nccl_result::success) {
        api_->group_end();
        return r;
      }
    }
    return api_->group_end();
  });
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    at::Tensor dst = tensors[i];
    copy_back(dst, bufs[i]);
  }
}

}  // namespace dra::comm
