// The codec bucket hook (include/dra/torch/elastic/codec_hook.hpp): dra's torch-free codecs on the
// elastic controller's gradient buckets, over the world's communicator.
#include "dra/torch/elastic/codec_hook.hpp"

#include <ATen/Functions.h>
#include <ATen/core/grad_mode.h>

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

constexpr char kTag[] = "dra.codec_hook/2";  // 2: with each bucket's tensor shapes

}  // namespace

void codec_hook::validate_spec(const std::string& spec, const compress::rigl_config& sparsity) {
  try {
    (void)compress::make_codec(spec, 0, sparsity);
  } catch (const std::invalid_argument& e) {
    dra::detail::throw_invalid("compress", "'" + spec + "' is not a codec (" + e.what() +
                                               "); use fp32, fp16, bf16, powersgd:<rank>, topk:<fraction>, "
                                               "random:<keep fraction> or masked[:<max sparsity>], or leave it empty "
                                               "for a plain all-reduce");
  }
}

codec_hook::codec_hook(std::string spec, std::uint64_t seed, compress::rigl_config sparsity)
    : spec_(std::move(spec)), seed_(seed), sparsity_(sparsity) {
  validate_spec(spec_, sparsity_);
}

compress::gradient_codec& codec_hook::codec_for(std::size_t index) {
  if (codecs_.size() <= index) codecs_.resize(index + 1);
  if (!codecs_[index]) codecs_[index] = compress::make_codec(spec_, seed_ + index, sparsity_);
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
  std::vector<std::vector<std::int64_t>> shapes(refs.size());
  for (std::size_t i = 0; i < refs.size(); ++i) {
    refs[i].data = base + layout.offsets[i];
    refs[i].shape = shapes[i] = layout.shapes[i].empty() ? std::vector<std::int64_t>{1} : layout.shapes[i];
  }
  follow_layout(codec, index, layout.params, shapes);
  // The masked codec reads the weights on its mask-update steps (host float copies where needed).
  std::vector<at::Tensor> weights;
  auto* sparse = dynamic_cast<compress::masked_sync_codec*>(&codec);
  if (sparse && sparse->update_next()) {
    if (layout.params.size() != refs.size())
      dra::detail::throw_invalid("layout", "the 'masked' codec needs each parameter of the bucket");
    for (std::size_t i = 0; i < refs.size(); ++i) {
      const at::Tensor w = layout.params[i].detach();  // a complex weight as its real view, as its gradient travels
      weights.push_back((w.is_complex() ? at::view_as_real(w) : w).to(at::kCPU, at::kFloat).contiguous());
      refs[i].weights = weights.back().data_ptr<float>();
    }
  }
  // What rides with the last bucket (loss, sample count, energy, decision flag) goes with the
  // codec's first all-reduce: no round trip of its own.
  at::Tensor exact_host = exact.is_cpu() ? exact : exact.to(at::kCPU);
  codec.reduce_with(refs, world, exact_host.numel() > 0 ? exact_host.data_ptr<float>() : nullptr,
                    static_cast<std::size_t>(exact_host.numel()));
  if (!exact.is_cpu() && exact.numel() > 0) exact.copy_(exact_host);
  host.mul_(static_cast<float>(comm.size()));  // the codecs return the mean; the reducer wants the sum
  if (!grads.is_cpu()) grads.copy_(host);
}

void codec_hook::follow_layout(compress::gradient_codec& codec, std::size_t index,
                               const std::vector<at::Tensor>& params,
                               const std::vector<std::vector<std::int64_t>>& shapes) {
  if (params_.size() <= index) params_.resize(index + 1);
  if (state_shapes_.size() <= index) state_shapes_.resize(index + 1);
  // The codec's per-tensor state (error feedback, warm start, masks) is indexed by the tensor's
  // place in the bucket. A parameter frozen or unfrozen since the state's layout (the reducer
  // follows requires_grad) shifts those places: each tensor's state moves with it. Both layouts
  // are the model's trainable parameters in one order, so the tensors common to both are their
  // longest common subsequence of shapes; it is computed from the shapes alone, which every
  // member holds alike (a joiner and a recovered member receive them with the state), so every
  // member moves the same state the same way.
  auto& before = state_shapes_[index];
  if (!before.empty() && before != shapes) {
    codec.remap_tensors(common_tensors(before, shapes), shapes);
    if (index < mask_tensors_.size()) mask_tensors_[index].clear();  // rebuilt for the new layout
  }
  before = shapes;
  if (!params.empty()) params_[index] = params;
}

std::vector<std::int64_t> codec_hook::common_tensors(const std::vector<std::vector<std::int64_t>>& before,
                                                     const std::vector<std::vector<std::int64_t>>& after) {
  std::vector<std::int64_t> from(after.size(), -1);
  // The common head and tail first (a freeze or unfreeze changes a stretch of the list): the
  // quadratic table below then covers only what lies between.
  std::size_t head = 0, tail = 0;
  while (head < before.size() && head < after.size() && before[head] == after[head]) {
    from[head] = static_cast<std::int64_t>(head);
    ++head;
  }
  while (tail < before.size() - head && tail < after.size() - head &&
         before[before.size() - 1 - tail] == after[after.size() - 1 - tail]) {
    from[after.size() - 1 - tail] = static_cast<std::int64_t>(before.size() - 1 - tail);
    ++tail;
  }
  const std::size_t n = before.size() - head - tail, m = after.size() - head - tail;
  if (n == 0 || m == 0) return from;
  auto b = [&](std::size_t i) -> const std::vector<std::int64_t>& { return before[head + i]; };
  auto a = [&](std::size_t j) -> const std::vector<std::int64_t>& { return after[head + j]; };
  // lcs[i][j]: the longest common subsequence of the middles' suffixes from i and j.
  std::vector<std::vector<std::uint32_t>> lcs(n + 1, std::vector<std::uint32_t>(m + 1, 0));
  for (std::size_t i = n; i-- > 0;)
    for (std::size_t j = m; j-- > 0;)
      lcs[i][j] = b(i) == a(j) ? lcs[i + 1][j + 1] + 1 : std::max(lcs[i + 1][j], lcs[i][j + 1]);
  for (std::size_t i = 0, j = 0; i < n && j < m;) {
    if (b(i) == a(j) && lcs[i][j] == lcs[i + 1][j + 1] + 1) {
      from[head + j++] = static_cast<std::int64_t>(head + i++);
    } else if (lcs[i + 1][j] >= lcs[i][j + 1]) {
      ++i;
    } else {
      ++j;
    }
  }
  return from;
}

void codec_hook::step_committed(const signals::convergence_signals& signals) {
  for (auto& c : codecs_)
    if (auto* sparse = dynamic_cast<compress::masked_sync_codec*>(c.get())) sparse->set_phase(signals.phase);
  apply_masks();
}

void codec_hook::apply_masks() {
  mask_tensors_.resize(codecs_.size());
  mask_versions_.resize(codecs_.size(), 0);
  at::NoGradGuard no_grad;
  for (std::size_t b = 0; b < codecs_.size() && b < params_.size(); ++b) {
    const auto* sparse = dynamic_cast<const compress::masked_sync_codec*>(codecs_[b].get());
    if (!sparse || !sparse->masks().fitted() || sparse->masks().size() != params_[b].size()) continue;
    // Masks for another layout than the parameters known here (loaded with a world change):
    // applied once the next reduction has moved them onto this layout (follow_layout).
    if (b < state_shapes_.size()) {
      bool fits = state_shapes_[b].size() == params_[b].size();
      for (std::size_t i = 0; fits && i < params_[b].size(); ++i) {
        auto shape = params_[b][i].sizes().vec();
        if (shape.empty()) shape = {1};
        fits = shape == state_shapes_[b][i];
      }
      if (!fits) continue;
    }
    const auto& masks = sparse->masks();
    auto& cached = mask_tensors_[b];
    if (cached.size() != params_[b].size() || mask_versions_[b] != masks.version()) {
      cached.assign(params_[b].size(), at::Tensor());
      for (std::size_t i = 0; i < params_[b].size(); ++i) {
        if (!masks.sparsified(i)) continue;
        const auto& m = masks.mask(i);
        at::Tensor t = at::empty({static_cast<std::int64_t>(m.size())}, at::kFloat);
        float* p = t.data_ptr<float>();
        for (std::size_t k = 0; k < m.size(); ++k) p[k] = m[k] ? 1.0f : 0.0f;
        const auto& param = params_[b][i];
        cached[i] = t.view(param.sizes()).to(param.device(), param.scalar_type());
      }
      mask_versions_[b] = masks.version();
    }
    for (std::size_t i = 0; i < params_[b].size(); ++i)
      if (cached[i].defined()) params_[b][i].detach().mul_(cached[i]);
  }
}

std::vector<std::pair<at::Tensor, at::Tensor>> codec_hook::sparsity_masks() {
  apply_masks();  // refreshes the cache (and the weights are masked already at this point)
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  for (std::size_t b = 0; b < mask_tensors_.size() && b < params_.size(); ++b)
    for (std::size_t i = 0; i < mask_tensors_[b].size() && i < params_[b].size(); ++i)
      if (mask_tensors_[b][i].defined()) out.emplace_back(params_[b][i], mask_tensors_[b][i]);
  return out;
}

double codec_hook::sparsity() const {
  std::size_t total = 0;
  double pruned = 0.0;
  for (const auto& c : codecs_)
    if (const auto* sparse = dynamic_cast<const compress::masked_sync_codec*>(c.get())) {
      const auto& m = sparse->masks();
      std::size_t n = 0;
      for (std::size_t t = 0; t < m.size(); ++t) n += m.sparsified(t) ? m.mask(t).size() : 0;
      pruned += m.sparse_fraction() * static_cast<double>(n);
      total += n;
    }
  return total ? pruned / static_cast<double>(total) : 0.0;
}

std::vector<std::uint8_t> codec_hook::shared_state() const {
  compress::detail::writer w;
  w.put_str(kTag);
  w.put_str(spec_);
  w.put<std::uint64_t>(codecs_.size());
  for (std::size_t b = 0; b < codecs_.size(); ++b) {
    const auto& c = codecs_[b];
    const auto bytes = c ? c->save_state(/*with_error_feedback=*/false) : std::vector<std::uint8_t>{};
    w.put<std::uint64_t>(bytes.size());
    w.out.insert(w.out.end(), bytes.begin(), bytes.end());
    // The shapes of the tensors this state is for (the bucket's layout at its latest reduction).
    const auto& shapes = b < state_shapes_.size() ? state_shapes_[b] : std::vector<std::vector<std::int64_t>>{};
    w.put<std::uint64_t>(shapes.size());
    for (const auto& shape : shapes) {
      w.put<std::uint64_t>(shape.size());
      for (auto d : shape) w.put<std::int64_t>(d);
    }
  }
  return w.out;
}

void codec_hook::load_shared_state(const std::vector<std::uint8_t>& bytes) {
  if (bytes.empty()) {  // the sender has no hook state (no codec ran there yet)
    for (const auto& c : codecs_)
      if (c) dropped_.sent += c->bytes().sent, dropped_.dense += c->bytes().dense;
    codecs_.clear();
    mask_tensors_.clear();
    mask_versions_.clear();
    state_shapes_.clear();
    return;
  }
  std::vector<std::unique_ptr<compress::gradient_codec>> loaded;
  std::vector<std::vector<std::vector<std::int64_t>>> shapes;
  try {
    compress::detail::reader r{bytes};
    if (r.get_str() != kTag) throw std::invalid_argument("not a codec hook's state");
    if (const auto spec = r.get_str(); spec != spec_)
      throw std::invalid_argument("the world compresses with '" + spec + "', this process with '" + spec_ + "'");
    loaded.resize(r.count(2 * sizeof(std::uint64_t)));
    shapes.resize(loaded.size());
    for (std::size_t i = 0; i < loaded.size(); ++i) {
      const auto n = r.get<std::uint64_t>();
      r.need(n);
      if (n > 0) {
        const std::vector<std::uint8_t> one(bytes.begin() + static_cast<std::ptrdiff_t>(r.pos),
                                            bytes.begin() + static_cast<std::ptrdiff_t>(r.pos + n));
        r.pos += n;
        loaded[i] = compress::make_codec(spec_, seed_ + i, sparsity_);
        loaded[i]->load_state(one);
      }
      shapes[i].resize(r.count(sizeof(std::uint64_t)));
      for (auto& shape : shapes[i]) {
        shape.resize(r.count(sizeof(std::int64_t)));
        for (auto& d : shape) d = r.get<std::int64_t>();
      }
    }
  } catch (const std::invalid_argument& e) {
    throw dra::state_mismatch_error(std::string("dra: the world's codec state does not fit this process: ") + e.what() +
                                    "; give every process the same `compress` option");
  }
  for (const auto& c : codecs_)
    if (c) dropped_.sent += c->bytes().sent, dropped_.dense += c->bytes().dense;
  codecs_ = std::move(loaded);
  state_shapes_ = std::move(shapes);
  mask_tensors_.clear();  // the loaded masks replace the cached ones
  mask_versions_.clear();
}

void codec_hook::world_changed(hook_transition how) {
  if (how != hook_transition::survived)
    for (auto& c : codecs_)
      if (c) c->clear_error_feedback();
  apply_masks();  // after a crash the leader's masks may be newer than this process's weights
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
