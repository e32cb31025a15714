#pragma once
// The interface every gradient codec implements (codecs.hpp lists them): the tensors it reduces,
// the collective it reduces them through, its byte counters and its serialisable state.
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "dra/error.hpp"

namespace dra::compress {

/// One gradient tensor: contiguous floats and their shape (row-major), and the parameter's own
/// values for a codec that reads them (the `masked` codec's RigL masks; others ignore it).
struct tensor_ref {
  float* data = nullptr;
  std::vector<std::int64_t> shape;
  const float* weights = nullptr;
  std::size_t size() const {
    std::size_t n = 1;
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    return n;
  }
};

/// What a codec needs from the world. Sums are elementwise over ranks, in place.
class collective {
 public:
  virtual ~collective() = default;
  virtual int world_size() const = 0;
  virtual void allreduce_sum(float* data, std::size_t n) = 0;
  /// Every rank contributes `bytes` bytes; out receives world_size x bytes, rank order.
  virtual void allgather(const void* in, std::size_t bytes, void* out) = 0;
};

/// Bytes a codec handed to the collective (per rank), and what fp32 would have sent.
struct byte_counter {
  std::uint64_t sent = 0;
  std::uint64_t dense = 0;
  double ratio() const { return sent > 0 ? static_cast<double>(dense) / static_cast<double>(sent) : 1.0; }
};

namespace detail {
// Little serialisation helpers: a codec's state is a flat byte string with a tag and a version.
struct writer {
  std::vector<std::uint8_t> out;
  template <class T>
  void put(const T& v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  void put_str(const std::string& s) {
    put<std::uint32_t>(static_cast<std::uint32_t>(s.size()));
    out.insert(out.end(), s.begin(), s.end());
  }
  void put_floats(const std::vector<float>& v) {
    put<std::uint64_t>(v.size());
    const auto* p = reinterpret_cast<const std::uint8_t*>(v.data());
    out.insert(out.end(), p, p + v.size() * sizeof(float));
  }
  /// A 0/1 vector, eight entries a byte.
  void put_bits(const std::vector<std::uint8_t>& v) {
    put<std::uint64_t>(v.size());
    std::vector<std::uint8_t> packed((v.size() + 7) / 8, 0);
    for (std::size_t i = 0; i < v.size(); ++i)
      if (v[i]) packed[i / 8] = static_cast<std::uint8_t>(packed[i / 8] | (1u << (i % 8)));
    out.insert(out.end(), packed.begin(), packed.end());
  }
};
struct reader {
  const std::vector<std::uint8_t>& in;
  std::size_t pos = 0;
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string get_str() {
    const auto n = get<std::uint32_t>();
    need(n);
    std::string s(in.begin() + static_cast<std::ptrdiff_t>(pos), in.begin() + static_cast<std::ptrdiff_t>(pos + n));
    pos += n;
    return s;
  }
  std::vector<float> get_floats() {
    const auto n = count(sizeof(float));
    need(n * sizeof(float));
    std::vector<float> v(n);
    if (n > 0) std::memcpy(v.data(), in.data() + pos, n * sizeof(float));  // an empty vector's data() may be null
    pos += n * sizeof(float);
    return v;
  }
  std::vector<std::uint8_t> get_bits() {
    const auto n = get<std::uint64_t>();
    if (n / 8 > in.size() - pos) need(in.size() - pos + 1);  // (n + 7) / 8 without overflow
    need((n + 7) / 8);
    std::vector<std::uint8_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = (in[pos + i / 8] >> (i % 8)) & 1u;
    pos += (n + 7) / 8;
    return v;
  }
  /// A length field of entries of at least `bytes_each` bytes each, refused (as truncated) when the
  /// bytes left cannot hold that many: a corrupt length must not become a huge allocation.
  std::uint64_t count(std::size_t bytes_each) {
    const auto n = get<std::uint64_t>();
    if (n > (in.size() - pos) / bytes_each) need(in.size() - pos + 1);
    return n;
  }
  void need(std::size_t n) const {
    if (n > in.size() - pos)
      dra::detail::throw_invalid("state", "codec state truncated; pass the bytes save_state() returned");
  }
};
inline std::uint16_t to_fp16(float f) {
  // IEEE binary16, round to nearest even; overflow to inf, underflow through subnormals to 0.
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0u));
  if (mag >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds above 65504
  if (mag < 0x38800000u) {                                                    // subnormal or zero in fp16
    if (mag < 0x33000000u) return static_cast<std::uint16_t>(sign);
    const std::uint32_t m = (mag & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(mag >> 23);  // 14..24: value / 2^-24 = m x 2^(e - 126)
    std::uint32_t h = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = ((mag - 0x38000000u) >> 13);
  const std::uint32_t rem = mag & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}
inline float from_fp16(std::uint16_t h) {
  const std::uint32_t sign = (h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, x;
  if (exp == 0) {
    if (man == 0) {
      x = sign;
    } else {  // subnormal
      exp = 127 - 15 + 1;
      while (!(man & 0x400u)) man <<= 1, --exp;
      x = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (man << 13);
  } else {
    x = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline std::uint16_t to_bf16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // NaN stays NaN
  x += 0x7fffu + ((x >> 16) & 1u);                                                            // round to nearest even
  return static_cast<std::uint16_t>(x >> 16);
}
inline float from_bf16(std::uint16_t h) {
  const std::uint32_t x = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
}  // namespace detail

class gradient_codec {
 public:
  virtual ~gradient_codec() = default;
  virtual std::string name() const = 0;
  /// Reduces `grads` in place to their (approximate) mean over the world. Every rank calls it with
  /// tensors of the same shapes in the same order.
  virtual void reduce(std::vector<tensor_ref>& grads, collective& world) = 0;
  /// The same, with `n` values at `exact` summed over the world alongside, uncompressed (the
  /// controller's loss and sample count ride with the gradients so). A codec packs them into its
  /// first all-reduce, saving a round trip per step; the others sum them apart afterwards.
  void reduce_with(std::vector<tensor_ref>& grads, collective& world, float* exact, std::size_t n) {
    exact_ = {exact, n};
    try {
      reduce(grads, world);
    } catch (...) {
      exact_ = {};
      throw;
    }
    if (exact_.size > 0) world.allreduce_sum(exact_.data, exact_.size);  // no all-reduce took them
    exact_ = {};
  }
  const byte_counter& bytes() const noexcept { return bytes_; }
  void reset_bytes() noexcept { bytes_ = {}; }
  std::int64_t steps() const noexcept { return steps_; }

  /// The codec's state as bytes (config tag, step, error feedback, warm start). Without
  /// `with_error_feedback` only what every rank shares (step, warm start): what a resize hands
  /// to joiners, whose own residual starts at zero (docs/guide/sage.md).
  std::vector<std::uint8_t> save_state(bool with_error_feedback = true) const {
    detail::writer w;
    w.put_str("dra.codec");
    w.put<std::uint32_t>(1);
    w.put_str(name());
    w.put<std::int64_t>(steps_);
    w.put<std::uint64_t>(with_error_feedback ? error_.size() : 0);
    if (with_error_feedback)
      for (const auto& e : error_) w.put_floats(e);
    save_extra(w);
    return w.out;
  }
  /// Restores save_state()'s bytes. Throws std::invalid_argument (and changes nothing) when they
  /// come from another codec or version.
  void load_state(const std::vector<std::uint8_t>& bytes) {
    detail::reader r{bytes};
    if (r.get_str() != "dra.codec") dra::detail::throw_invalid("state", "not a dra codec state");
    if (const auto v = r.get<std::uint32_t>(); v != 1)
      dra::detail::throw_invalid("state", "codec state version " + std::to_string(v) + " unsupported (expected 1)");
    if (const auto n = r.get_str(); n != name())
      dra::detail::throw_invalid(
          "state", "state of codec '" + n + "' cannot load into '" + name() + "'; build the same codec first");
    const auto steps = r.get<std::int64_t>();
    std::vector<std::vector<float>> error(r.count(sizeof(std::uint64_t)));
    for (auto& e : error) e = r.get_floats();
    auto extra = load_extra(r);  // validates before anything changes
    steps_ = steps;
    error_ = std::move(error);
    commit_extra(std::move(extra));
  }
  /// The tensors reduced change (a parameter frozen or unfrozen between steps: the controller's
  /// bucket loses or gains it): new tensor i, of shape shapes[i], takes the per-tensor state of old
  /// tensor from[i] (error feedback, PowerSGD's warm start, the RigL mask) when that had the same
  /// number of elements, else starts fresh (from[i] = -1: a tensor not reduced before). The step
  /// counter stays. Every rank must remap alike (the state every rank shares stays shared).
  /// Throws std::invalid_argument (and changes nothing) when the sizes of from and shapes differ.
  void remap_tensors(const std::vector<std::int64_t>& from, const std::vector<std::vector<std::int64_t>>& shapes) {
    if (from.size() != shapes.size())
      dra::detail::throw_invalid("from", std::to_string(from.size()) + " sources for " + std::to_string(shapes.size()) +
                                             " tensors; give one source (or -1) per new tensor");
    std::vector<std::vector<float>> error(from.size());
    for (std::size_t i = 0; i < from.size(); ++i) {
      const auto j = from[i];
      std::size_t n = 1;
      for (auto d : shapes[i]) n *= static_cast<std::size_t>(std::max<std::int64_t>(d, 0));
      if (j >= 0 && static_cast<std::size_t>(j) < error_.size() && error_[static_cast<std::size_t>(j)].size() == n)
        error[i] = error_[static_cast<std::size_t>(j)];
    }
    remap_extra(from, shapes);
    error_ = std::move(error);
  }
  /// Drops this rank's error feedback (a joiner's starting point). Warm start and step stay.
  void clear_error_feedback() {
    for (auto& e : error_) std::fill(e.begin(), e.end(), 0.0f);
  }
  /// Sum of |residual| this rank carries to later steps (0: nothing pending).
  double error_feedback_norm1() const {
    double s = 0.0;
    for (const auto& e : error_)
      for (float v : e) s += std::fabs(static_cast<double>(v));
    return s;
  }

 protected:
  struct extra_state {
    std::vector<std::vector<float>> blocks;
  };
  virtual void save_extra(detail::writer&) const {}
  virtual extra_state load_extra(detail::reader&) const { return {}; }
  virtual void commit_extra(extra_state) {}
  /// remap_tensors' part for a codec's own per-tensor state (called before error_ is replaced).
  virtual void remap_extra(const std::vector<std::int64_t>& /*from*/,
                           const std::vector<std::vector<std::int64_t>>& /*shapes*/) {}

  /// The error-feedback buffer of tensor i, sized on first use.
  std::vector<float>& error_for(std::size_t i, std::size_t n) {
    if (error_.size() <= i) error_.resize(i + 1);
    if (error_[i].size() != n) {
      if (!error_[i].empty())
        dra::detail::throw_invalid("grads", "tensor " + std::to_string(i) + " has " + std::to_string(n) +
                                                " elements, the codec saw " + std::to_string(error_[i].size()) +
                                                "; reduce the same tensors every step");
      error_[i].assign(n, 0.0f);
    }
    return error_[i];
  }
  static void check_world(const collective& world) {
    if (world.world_size() < 1)
      dra::detail::throw_invalid("world", "world_size must be >= 1, got " + std::to_string(world.world_size()));
  }
  /// What every reduce() checks before it touches anything: the world, and tensors whose shape has
  /// no negative dimension and whose data is set when they hold elements.
  static void check_inputs(const std::vector<tensor_ref>& grads, const collective& world) {
    check_world(world);
    for (std::size_t t = 0; t < grads.size(); ++t) {
      for (const auto d : grads[t].shape)
        if (d < 0)
          dra::detail::throw_invalid("grads", "tensor " + std::to_string(t) + " has a negative dimension (" +
                                                  std::to_string(d) + ") in its shape; pass the tensor's sizes");
      if (grads[t].data == nullptr && grads[t].size() > 0)
        dra::detail::throw_invalid("grads", "tensor " + std::to_string(t) + " has " + std::to_string(grads[t].size()) +
                                                " elements and no data; point tensor_ref::data at them");
    }
  }
  /// For a codec that addresses entries with 32-bit indices (top-k's pairs, the random and RigL
  /// masks' index lists): a larger tensor would wrap its indices and silently send or place the
  /// wrong entries. Checked before anything changes.
  void check_indexable(const std::vector<tensor_ref>& grads) const {
    for (std::size_t t = 0; t < grads.size(); ++t)
      if (grads[t].size() > std::numeric_limits<std::uint32_t>::max())
        dra::detail::throw_invalid("grads", "tensor " + std::to_string(t) + " has " + std::to_string(grads[t].size()) +
                                                " elements; '" + name() +
                                                "' indexes at most 4294967295 per tensor: split the "
                                                "parameter, or use fp32, fp16, bf16 or powersgd for it");
  }
  /// What a residual may carry to later steps: a non-finite value (a NaN or inf gradient, or an
  /// fp16 overflow) goes out in the step that produced it, as fp32 would send it, and is not
  /// carried: once in the residual it would make every later step of that entry non-finite.
  static float carried(float residual) noexcept { return std::isfinite(residual) ? residual : 0.0f; }
  /// Appends the values riding along (reduce_with) to the buffer of the codec's first all-reduce;
  /// returns where they start (exact_ then waits for ride_back).
  std::size_t ride_along(std::vector<float>& buf) const {
    const std::size_t at = buf.size();
    buf.insert(buf.end(), exact_.data, exact_.data + exact_.size);
    return at;
  }
  /// Copies the summed values back from that buffer after its all-reduce.
  void ride_back(const std::vector<float>& buf, std::size_t at) {
    std::copy(buf.begin() + static_cast<std::ptrdiff_t>(at),
              buf.begin() + static_cast<std::ptrdiff_t>(at + exact_.size), exact_.data);
    exact_ = {};
  }
  struct exact_values {
    float* data = nullptr;
    std::size_t size = 0;
  };
  exact_values exact_;

  byte_counter bytes_;
  std::int64_t steps_ = 0;
  std::vector<std::vector<float>> error_;
};

}  // namespace dra::compress
