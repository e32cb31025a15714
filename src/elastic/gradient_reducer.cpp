#include "gradient_reducer.hpp"

#include <ATen/Functions.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <array>
#include <limits>

#include "dra/error.hpp"

namespace dra::elastic::detail {

reduction_tail read_tail(const at::Tensor& tail) {
  const at::Tensor t = tail.to(at::kCPU, at::kDouble);  // a CUDA tail would synchronise: the controller defers those
  const double* p = t.data_ptr<double>();
  return {p[0], p[1], p[2] > 0.5, p[3], p[4], p[5] > 0.5, p[6], p[7], p[8], p[9], p[10], p[11], p[12], p[13], p[14]};
}

namespace {
// The exactly-once slots [skipped, skip mask, depth ranks, depth sum, depth square sum, micro sum,
// micro square sum, missed, stale].
std::array<float, 9> batch_slots(const tail_input& in) {
  const bool skipped = in.skipped > 0;
  const float mask = skipped && in.rank >= 0 && in.rank < 24 ? static_cast<float>(1 << in.rank) : 0.0f;
  const bool known = in.in_flight >= 0;
  const auto depth = static_cast<float>(known ? in.in_flight : 0);
  const auto micro = static_cast<float>(std::max(in.micro, 1));
  return {static_cast<float>(std::max(in.skipped, 0)),
          mask,
          known ? 1.0f : 0.0f,
          depth,
          depth * depth,
          micro,
          micro * micro,
          in.missed ? 1.0f : 0.0f,
          in.stale ? 1.0f : 0.0f};
}

// How a parameter's gradient travels: float64 (and complex128) in float64 buckets, every other
// type in float32 ones (the float32 buckets reduced a float64 model's gradients to 1e-6 relative
// error; torch's DDP reduces in the parameter's dtype); a complex gradient as its real view (its
// imaginary part was dropped: a complex weight's never trained).
at::ScalarType wire_type(const at::Tensor& p) {
  const auto t = p.scalar_type();
  return t == at::kDouble || t == at::kComplexDouble ? at::kDouble : at::kFloat;
}
std::int64_t wire_numel(const at::Tensor& p) {
  return p.is_complex() ? 2 * p.numel() : p.numel();
}
std::vector<std::int64_t> wire_sizes(const at::Tensor& p) {
  auto s = p.sizes().vec();
  if (p.is_complex()) s.push_back(2);
  return s;
}
at::Tensor wire_view(const at::Tensor& g) {
  return g.is_complex() ? at::view_as_real(g) : g;
}
}  // namespace

void write_tail(at::Tensor& dst, const tail_input& in) {
  if (dst.device().is_cpu()) {
    float* p = dst.data_ptr<float>();
    const double loss = in.loss.defined() ? in.loss.item<double>() : in.loss_value;
    p[0] = in.count > 0 ? static_cast<float>(loss * in.count) : 0.0f;
    p[1] = static_cast<float>(in.count);
    p[2] = in.decision_flag ? 1.0f : 0.0f;
    p[3] = static_cast<float>(in.energy_j);
    p[4] = in.energy_measured ? 0.0f : 1.0f;
    p[5] = in.stop ? 1.0f : 0.0f;
    const auto slots = batch_slots(in);
    std::copy(slots.begin(), slots.end(), p + 6);
    return;
  }
  at::Tensor slot = dst.narrow(0, 0, 1);
  if (in.loss.defined() && in.count > 0 && !in.loss.device().is_cpu()) {
    // The loss stays on the device: never read here.
    at::mul_out(slot, in.loss.detach().reshape({1}).to(dst.device(), at::kFloat), in.count);
  } else {
    const double loss = in.loss.defined() ? in.loss.item<double>() : in.loss_value;  // a CPU value
    slot.fill_(in.count > 0 ? loss * in.count : 0.0);
  }
  dst.narrow(0, 1, 1).fill_(in.count);
  dst.narrow(0, 2, 1).fill_(in.decision_flag ? 1.0 : 0.0);
  dst.narrow(0, 3, 1).fill_(in.energy_j);
  dst.narrow(0, 4, 1).fill_(in.energy_measured ? 0.0 : 1.0);
  dst.narrow(0, 5, 1).fill_(in.stop ? 1.0 : 0.0);
  const auto slots = batch_slots(in);
  for (std::size_t i = 0; i < slots.size(); ++i) dst.narrow(0, 6 + static_cast<std::int64_t>(i), 1).fill_(slots[i]);
}

gradient_reducer::gradient_reducer(std::size_t bucket_bytes, std::size_t first_bucket_bytes)
    : bucket_bytes_(std::max<std::size_t>(bucket_bytes, 4)),
      first_bucket_bytes_(std::max<std::size_t>(first_bucket_bytes, 4)) {}

void gradient_reducer::layout(const std::vector<at::Tensor>& params, const at::Device& device, bool single,
                              bool flags) {
  bool same = !buckets_.empty() && params.size() == params_.size() && buckets_.back().flat.device() == device &&
              single_ == single && flags_ == flags;
  for (std::size_t i = 0; same && i < params.size(); ++i)
    same = params[i].unsafeGetTensorImpl() == params_[i].unsafeGetTensorImpl() &&
           params[i].numel() == params_[i].numel() && types_[i] == params[i].scalar_type();
  params_ = params;
  if (same) return;
  types_.clear();
  for (const auto& p : params) types_.push_back(p.scalar_type());
  buckets_.clear();
  bucket_of_.assign(params.size(), 0);
  single_ = single;
  flags_ = flags;
  // Reverse order: backward produces the last layers' gradients first.
  constexpr auto unbounded = std::numeric_limits<std::int64_t>::max() / 2;
  const auto cap_of = [&](std::size_t bytes, at::ScalarType type) {
    return single ? unbounded : static_cast<std::int64_t>(bytes / at::elementSize(type));
  };
  bucket current;
  std::int64_t cap = 0;
  for (std::size_t k = params.size(); k-- > 0;) {
    const auto n = wire_numel(params[k]);
    const auto type = wire_type(params[k]);
    if (!current.params.empty() && (current.numel + n > cap || type != current.type)) {
      buckets_.push_back(std::move(current));
      current = bucket{};
    }
    if (current.params.empty())
      current.type = type, cap = cap_of(buckets_.empty() ? first_bucket_bytes_ : bucket_bytes_, type);
    bucket_of_[k] = buckets_.size();
    current.params.push_back(k);
    current.offsets.push_back(current.numel);
    current.shapes.offsets.push_back(current.numel);
    current.shapes.shapes.push_back(wire_sizes(params[k]));
    current.shapes.params.push_back(params[k]);
    current.numel += n;
  }
  const bool float_last = current.type == at::kFloat;
  buckets_.push_back(std::move(current));    // the last one (possibly without gradients) carries the tail
  if (!float_last) buckets_.emplace_back();  // in float32: a bucket of its own after a float64 one
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    auto& bk = buckets_[b];
    const auto extra =
        b + 1 == buckets_.size() ? kTail + (flags ? static_cast<std::int64_t>(params.size()) : std::int64_t{0}) : 0;
    bk.flat = at::zeros({bk.numel + extra}, at::TensorOptions().dtype(bk.type).device(device));
  }
}

at::Tensor gradient_reducer::flags_slot() {
  auto& last = buckets_.back();
  return last.flat.narrow(0, last.numel + kTail, static_cast<std::int64_t>(params_.size()));
}

void gradient_reducer::begin(comm::communicator& comm, const std::vector<at::Tensor>& params, double weight,
                             const tail_input& tail, bool unused_to_none) {
  comm_ = nullptr;
  // A synchronous communicator (Gloo) blocks backward for each bucket: nothing overlaps, so one
  // bucket (one all-reduce per step, as before buckets) is the cheapest there.
  layout(params, comm.device(), !comm.asynchronous(), unused_to_none);
  used_.assign(params.size(), 0.0F);
  comm_ = &comm;
  weight_ = weight;
  failure_.clear();
  next_launch_ = 0;
  reported_.assign(params.size(), 0);
  for (auto& b : buckets_) b.waiting = b.params.size();
  auto& last = buckets_.back();
  at::Tensor slot = last.flat.narrow(0, last.numel, kTail);
  write_tail(slot, tail);
  launch_ready();  // a bucket without parameters (a model without any) goes at once
}

void gradient_reducer::ready(std::size_t index) {
  if (!comm_ || index >= reported_.size() || reported_[index]) return;  // a second hook (accumulation): first wins
  reported_[index] = 1;
  auto& b = buckets_[bucket_of_[index]];
  std::size_t pos = 0;
  while (b.params[pos] != index) ++pos;
  const auto& p = params_[index];
  at::Tensor dst = b.flat.narrow(0, b.offsets[pos], wire_numel(p));
  const at::Tensor& g = p.grad();
  if (!g.defined() || weight_ == 0.0) {
    dst.zero_();
  } else if (const at::Tensor w = wire_view(g); w.device() == dst.device() && w.scalar_type() == dst.scalar_type()) {
    at::mul_out(dst, w.reshape({-1}), weight_);
  } else {
    dst.copy_(w.reshape({-1}));
    dst.mul_(weight_);
  }
  used_[index] = g.defined() && weight_ != 0.0 ? 1.0F : 0.0F;
  --b.waiting;
  launch_ready();
}

void gradient_reducer::launch_ready() {
  while (failure_.empty() && next_launch_ < buckets_.size() && buckets_[next_launch_].waiting == 0)
    launch(next_launch_++);
}

void gradient_reducer::launch(std::size_t b) {
  auto& bk = buckets_[b];
  // The last bucket goes once every parameter was reported: which had a gradient is known.
  if (flags_ && b + 1 == buckets_.size() && !used_.empty())
    flags_slot().copy_(at::from_blob(used_.data(), {static_cast<std::int64_t>(used_.size())}, at::kFloat));
  auto reduce = [&] {
    if (hook_ && bk.type == at::kFloat) {  // a codec compresses float32 buckets; float64 ones go whole
      at::Tensor grads = bk.flat.narrow(0, 0, bk.numel);
      at::Tensor exact = bk.flat.narrow(0, bk.numel, bk.flat.numel() - bk.numel);
      hook_->reduce(*comm_, b, bk.shapes, grads, exact);
    } else {
      comm_->all_reduce_sum(bk.flat);
    }
  };
  try {
    if (!bk.flat.is_cuda()) {
      reduce();
      return;
    }
    // CUDA: on the reductions' own stream, after the bucket's gradients, while backward goes on.
    const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    const auto dev = bk.flat.device();
    if (!stream_ || stream_->device() != dev) stream_ = impl->getStreamFromGlobalPool(dev, /*isHighPriority=*/true);
    c10::Event filled(c10::DeviceType::CUDA);
    filled.record(impl->getStream(dev));
    filled.block(*stream_);
    impl->recordDataPtrOnStream(bk.flat.storage().data_ptr(), *stream_);
    c10::StreamGuard guard(*stream_);
    reduce();
  } catch (const dra::error& e) {
    failure_ = e.what();
  }
}

at::Tensor gradient_reducer::finish() {
  if (!comm_) throw std::logic_error("gradient_reducer::finish without begin");
  for (std::size_t i = 0; i < reported_.size() && failure_.empty(); ++i)
    if (!reported_[i]) ready(i);  // never reported: no gradient on this rank, counts as zero
  launch_ready();
  comm_ = nullptr;
  if (!failure_.empty()) throw dra::comm_error(failure_);
  const auto dev = buckets_.back().flat.device();
  if (dev.is_cuda() && stream_) {
    const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    c10::Event reduced(c10::DeviceType::CUDA);
    reduced.record(*stream_);
    reduced.block(impl->getStream(dev));  // the caller's stream waits for the reductions, the host does not
  }
  // unused_to_none: the world's counts are read only where this rank lacked a gradient (a
  // parameter this rank had one for was used somewhere): on CUDA that read waits for the reduction.
  std::vector<float> world_used;
  if (flags_ && std::find(used_.begin(), used_.end(), 0.0F) != used_.end()) {
    at::Tensor counts = flags_slot().to(at::kCPU).contiguous();
    world_used.assign(counts.data_ptr<float>(), counts.data_ptr<float>() + counts.numel());
  }
  for (const auto& b : buckets_) {
    for (std::size_t k = 0; k < b.params.size(); ++k) {
      const auto& p = params_[b.params[k]];
      if (!world_used.empty() && world_used[b.params[k]] == 0.0F && !p.grad().defined())
        continue;  // no rank had a gradient for it: it keeps none, as in one process
      at::Tensor src = b.flat.narrow(0, b.offsets[k], wire_numel(p)).view(wire_sizes(p));
      if (!p.grad().defined()) {
        auto& grad = const_cast<at::Tensor&>(p).mutable_grad();
        if (p.is_complex()) {
          grad = at::view_as_complex(src.to(p.device(), wire_type(p)).clone(at::MemoryFormat::Contiguous));
        } else {
          grad = src.to(p.device(), p.scalar_type()).clone();
        }
      } else {
        wire_view(p.grad()).copy_(src);
      }
    }
  }
  auto& last = buckets_.back();
  return last.flat.narrow(0, last.numel, kTail);
}

void gradient_reducer::cancel() noexcept {
  comm_ = nullptr;
}

}  // namespace dra::elastic::detail
