// The codec bucket hook (include/dra/torch/elastic/codec_hook.hpp): dra's torch-free codecs on the
// elastic controller's gradient buckets, over the world's communicator.
#include "dra/torch/elastic/codec_hook.hpp"

#include <ATen/Functions.h>

#include <cstring>

#include "dra/error.hpp"

namespace dra::elastic {

namespace {

// The codecs' collective over a dra communicator. On a device communicator (NCCL) the host
// buffers go to the device and back.
class comm_collective final : public compress::collective {
 public:
  explicit comm_collective(comm::communicator& comm) : comm_(comm) {}
  int world_size() const override { return comm_.size(); }
  void allreduce_sum(float* data, std::size_t n) override {
    at::Tensor host = at::from_blob(data, {static_cast<std::int64_t>(n)}, at::kFloat);
    reduce(host);
  }
  // The communicator has no all-gather: each rank writes its bytes into its own slot of a zeroed
  // int32 buffer and the buffer is summed (x + 0 is exact for integers). It moves world_size times
  // the bytes of a true all-gather through a ring; the codec's counter reports its own payload.
  void allgather(const void* in, std::size_t bytes, void* out) override {
    const std::size_t words = (bytes + 3) / 4;
    const auto w = static_cast<std::size_t>(comm_.size());
    at::Tensor buf = at::zeros({static_cast<std::int64_t>(words * w)}, at::kInt);
    std::memcpy(static_cast<char*>(buf.data_ptr()) + words * 4 * static_cast<std::size_t>(comm_.rank()), in, bytes);
    reduce(buf);
    const char* base = static_cast<const char*>(buf.data_ptr());
    for (std::size_t r = 0; r < w; ++r) std::memcpy(static_cast<char*>(out) + r * bytes, base + r * words * 4, bytes);
  }

 private:
  void reduce(at::Tensor& host) {
    if (comm_.device().is_cpu()) {
      comm_.all_reduce_sum(host);
      return;
    }
    at::Tensor dev = host.to(comm_.device());
    comm_.all_reduce_sum(dev);
    host.copy_(dev.cpu());
  }
  comm::communicator& comm_;
};

constexpr char kTag[] = "dra.codec_hook";

}  // namespace

void codec_hook::validate_spec(const std::string& spec) {
  const std::string kind = spec.substr(0, spec.find(':'));
  if (kind == "masked")
    dra::detail::throw_invalid("compress",
                               "'masked' takes its masks from the trainer (a dynamic sparsifier); as an option use "
                               "'random:<keep fraction>', or install a codec_hook/bucket_hook that sets the masks");
  try {
    (void)compress::make_codec(spec);
  } catch (const std::invalid_argument& e) {
    dra::detail::throw_invalid("compress", "'" + spec + "' is not a codec (" + e.what() +
                                               "); use fp32, fp16, bf16, powersgd:<rank>, topk:<fraction> or "
                                               "random:<keep fraction>, or leave it empty for a plain all-reduce");
  }
}

codec_hook::codec_hook(std::string spec, std::uint64_t seed) : spec_(std::move(spec)), seed_(seed) {
  validate_spec(spec_);
}

compress::gradient_codec& codec_hook::codec_for(std::size_t index) {
  if (codecs_.size() <= index) codecs_.resize(index + 1);
  if (!codecs_[index]) codecs_[index] = compress::make_codec(spec_, seed_ + index);
  return *codecs_[index];
}

compress::gradient_codec* codec_hook::codec(std::size_t index) const noexcept {
  return index < codecs_.size() ? codecs_[index].get() : nullptr;
}

void codec_hook::reduce(comm::communicator& comm, std::size_t index, const bucket_layout& layout, at::Tensor& grads,
                        at::Tensor& exact) {
  if (layout.offsets.size() != layout.shapes.size())
    dra::detail::throw_invalid("layout", "offsets and shapes differ in length");
  auto& codec = codec_for(index);
  comm_collective world(comm);
  at::Tensor host = grads.is_cpu() ? grads : grads.to(at::kCPU);
  float* base = host.data_ptr<float>();
  std::vector<compress::tensor_ref> refs(layout.offsets.size());
  for (std::size_t i = 0; i < refs.size(); ++i) {
    refs[i].data = base + layout.offsets[i];
    refs[i].shape = layout.shapes[i].empty() ? std::vector<std::int64_t>{1} : layout.shapes[i];
  }
  codec.reduce(refs, world);
  host.mul_(static_cast<float>(comm.size()));  // the codecs return the mean; the reducer wants the sum
  if (!grads.is_cpu()) grads.copy_(host);
  if (exact.numel() > 0) comm.all_reduce_sum(exact);
}

std::vector<std::uint8_t> codec_hook::shared_state() const {
  compress::detail::writer w;
  w.put_str(kTag);
  w.put_str(spec_);
  w.put<std::uint64_t>(codecs_.size());
  for (const auto& c : codecs_) {
    const auto bytes = c ? c->save_state(/*with_error_feedback=*/false) : std::vector<std::uint8_t>{};
    w.put<std::uint64_t>(bytes.size());
    w.out.insert(w.out.end(), bytes.begin(), bytes.end());
  }
  return w.out;
}

void codec_hook::load_shared_state(const std::vector<std::uint8_t>& bytes) {
  if (bytes.empty()) {  // the sender has no hook state (no codec ran there yet)
    for (const auto& c : codecs_)
      if (c) dropped_.sent += c->bytes().sent, dropped_.dense += c->bytes().dense;
    codecs_.clear();
    return;
  }
  std::vector<std::unique_ptr<compress::gradient_codec>> loaded;
  try {
    compress::detail::reader r{bytes};
    if (r.get_str() != kTag) throw std::invalid_argument("not a codec hook's state");
    if (const auto spec = r.get_str(); spec != spec_)
      throw std::invalid_argument("the world compresses with '" + spec + "', this process with '" + spec_ + "'");
    loaded.resize(r.get<std::uint64_t>());
    for (std::size_t i = 0; i < loaded.size(); ++i) {
      const auto n = r.get<std::uint64_t>();
      r.need(n);
      if (n == 0) continue;
      const std::vector<std::uint8_t> one(bytes.begin() + static_cast<std::ptrdiff_t>(r.pos),
                                          bytes.begin() + static_cast<std::ptrdiff_t>(r.pos + n));
      r.pos += n;
      loaded[i] = compress::make_codec(spec_, seed_ + i);
      loaded[i]->load_state(one);
    }
  } catch (const std::invalid_argument& e) {
    throw dra::state_mismatch_error(std::string("dra: the world's codec state does not fit this process: ") + e.what() +
                                    "; give every process the same `compress` option");
  }
  for (const auto& c : codecs_)
    if (c) dropped_.sent += c->bytes().sent, dropped_.dense += c->bytes().dense;
  codecs_ = std::move(loaded);
}

void codec_hook::world_changed(hook_transition how) {
  if (how == hook_transition::survived) return;
  for (auto& c : codecs_)
    if (c) c->clear_error_feedback();
}

hook_bytes codec_hook::bytes() const {
  hook_bytes b = dropped_;
  for (const auto& c : codecs_)
    if (c) b.sent += c->bytes().sent, b.dense += c->bytes().dense;
  return b;
}

double codec_hook::error_feedback_norm1() const {
  double s = 0.0;
  for (const auto& c : codecs_)
    if (c) s += c->error_feedback_norm1();
  return s;
}

}  // namespace dra::elastic
