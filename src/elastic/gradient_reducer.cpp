#include "gradient_reducer.hpp"

#include <ATen/Functions.h>

namespace dra::elastic::detail {

gradient_reducer::tail gradient_reducer::reduce(comm::communicator& comm, const std::vector<at::Tensor>& params,
                                                double weight, const tail& mine) {
  constexpr std::int64_t kTail = 3;
  std::int64_t total = 0;
  for (const auto& p : params) total += p.numel();
  if (!flat_.defined() || flat_.numel() != total + kTail) flat_ = at::empty({total + kTail}, at::kFloat);
  std::int64_t off = 0;
  for (const auto& p : params) {
    const auto n = p.numel();
    at::Tensor dst = flat_.narrow(0, off, n);
    const at::Tensor& g = p.grad();
    if (!g.defined() || weight == 0.0)
      dst.zero_();
    else
      at::mul_out(dst, g.reshape({-1}), weight);
    off += n;
  }
  float* t = flat_.data_ptr<float>() + total;
  t[0] = static_cast<float>(mine.loss_sum);
  t[1] = static_cast<float>(mine.count);
  t[2] = mine.decision_flag ? 1.0f : 0.0f;
  comm.all_reduce_sum(flat_);
  t = flat_.data_ptr<float>() + total;
  const tail world{t[0], t[1], t[2] > 0.5f};
  off = 0;
  for (const auto& p : params) {
    const auto n = p.numel();
    at::Tensor src = flat_.narrow(0, off, n).view(p.sizes());
    if (!p.grad().defined()) {
      auto& grad = const_cast<at::Tensor&>(p).mutable_grad();
      grad = src.to(p.dtype()).clone();
    } else {
      p.grad().copy_(src);
    }
    off += n;
  }
  return world;
}

}  // namespace dra::elastic::detail
