// Compression codecs: the maths of each codec over a real multi-threaded world (ranks are threads
// exchanging buffers), error feedback, byte counting and state serialisation.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "dra/compress/codecs.hpp"

using namespace dra::compress;

namespace {
// Ranks as threads: each exchange deposits a rank's bytes, waits for all, reads everyone's.
// Sums are taken in rank order on every rank, so results are bit-identical across ranks.
class thread_world {
 public:
  explicit thread_world(int n) : n_(n), slots_(static_cast<std::size_t>(n)) {}
  int size() const { return n_; }
  std::vector<std::vector<std::uint8_t>> exchange(int rank, const void* data, std::size_t bytes) {
    const auto* p = static_cast<const std::uint8_t*>(data);
    slots_[static_cast<std::size_t>(rank)].assign(p, p + bytes);
    barrier();
    auto all = slots_;
    barrier();
    return all;
  }

 private:
  void barrier() {
    std::unique_lock<std::mutex> lock(m_);
    const int gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen != generation_; });
    }
  }
  int n_;
  std::vector<std::vector<std::uint8_t>> slots_;
  std::mutex m_;
  std::condition_variable cv_;
  int arrived_ = 0, generation_ = 0;
};

class thread_collective final : public collective {
 public:
  thread_collective(thread_world& w, int rank) : w_(w), rank_(rank) {}
  int world_size() const override { return w_.size(); }
  void allreduce_sum(float* data, std::size_t n) override {
    auto all = w_.exchange(rank_, data, n * sizeof(float));
    for (std::size_t i = 0; i < n; ++i) {
      float s = 0.0f;
      for (const auto& slot : all) s += reinterpret_cast<const float*>(slot.data())[i];
      data[i] = s;
    }
  }
  void allgather(const void* in, std::size_t bytes, void* out) override {
    auto all = w_.exchange(rank_, in, bytes);
    auto* o = static_cast<std::uint8_t*>(out);
    for (const auto& slot : all) o = std::copy(slot.begin(), slot.end(), o);
  }

 private:
  thread_world& w_;
  int rank_;
};

// Counts the all-reduces a codec issues (round trips on a real link).
class counting_collective final : public collective {
 public:
  explicit counting_collective(collective& inner) : inner_(inner) {}
  int world_size() const override { return inner_.world_size(); }
  void allreduce_sum(float* data, std::size_t n) override {
    ++allreduces;
    inner_.allreduce_sum(data, n);
  }
  void allgather(const void* in, std::size_t bytes, void* out) override { inner_.allgather(in, bytes, out); }
  int allreduces = 0;

 private:
  collective& inner_;
};

// Runs body(rank, collective) on `world` threads.
void run_world(int world, const std::function<void(int, collective&)>& body) {
  thread_world w(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      thread_collective c(w, r);
      body(r, c);
    });
  for (auto& t : threads) t.join();
}

std::vector<float> random_vec(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}
}  // namespace

TEST_CASE("compress.fp32.is_the_exact_mean") {
  const int world = 3;
  std::vector<std::vector<float>> out(world);
  run_world(world, [&](int r, collective& c) {
    auto g = random_vec(10, static_cast<unsigned>(r));
    std::vector<tensor_ref> t{{g.data(), {10}}};
    fp32_codec codec;
    codec.reduce(t, c);
    out[static_cast<std::size_t>(r)] = g;
    CHECK(codec.bytes().sent == 40);
  });
  for (std::size_t i = 0; i < 10; ++i) {
    float s = 0;
    for (int r = 0; r < world; ++r) s += random_vec(10, static_cast<unsigned>(r))[i];
    CHECK(out[0][i] == doctest::Approx(s / 3));
    CHECK(out[1][i] == out[0][i]);
  }
}

TEST_CASE("compress.masked.equals_the_masked_dense_allreduce_bit_for_bit") {
  const int world = 4;
  const std::size_t n = 1000;
  std::vector<std::uint8_t> mask(n);
  std::mt19937 rng(7);
  for (auto& m : mask) m = (rng() % 10) == 0;  // keep about 10 %
  std::size_t kept = 0;
  for (auto m : mask) kept += m;
  std::vector<std::vector<float>> sparse(world), dense(world);
  run_world(world, [&](int r, collective& c) {
    auto g = random_vec(n, 100u + static_cast<unsigned>(r));
    auto d = g;
    for (std::size_t i = 0; i < n; ++i) d[i] = mask[i] ? d[i] : 0.0f;
    std::vector<tensor_ref> ts{{g.data(), {20, 50}}}, td{{d.data(), {20, 50}}};
    masked_codec codec(0.0, 0, /*error_feedback=*/true);
    codec.set_masks({mask});
    codec.reduce(ts, c);
    CHECK(codec.name() == "set_masks");
    fp32_codec().reduce(td, c);
    sparse[static_cast<std::size_t>(r)] = g;
    dense[static_cast<std::size_t>(r)] = d;
    CHECK(codec.bytes().sent == 4 * kept);
    CHECK(codec.bytes().ratio() == doctest::Approx(static_cast<double>(n) / static_cast<double>(kept)));
  });
  for (int r = 0; r < world; ++r)
    for (std::size_t i = 0; i < n; ++i)
      CHECK(sparse[static_cast<std::size_t>(r)][i] == dense[static_cast<std::size_t>(r)][i]);
}

TEST_CASE("compress.masked.error_feedback_delivers_dropped_entries_later") {
  run_world(2, [&](int, collective& c) {
    masked_codec codec(0.0, 0, true);
    std::vector<float> g{1.0f, 2.0f};
    std::vector<tensor_ref> t{{g.data(), {2}}};
    codec.set_masks({{1, 0}});
    codec.reduce(t, c);
    CHECK(g[0] == doctest::Approx(1.0f));
    CHECK(g[1] == 0.0f);
    g = {0.0f, 0.0f};
    codec.set_masks({{0, 1}});
    codec.reduce(t, c);
    CHECK(g[1] == doctest::Approx(2.0f));  // the entry dropped last step arrives now
  });
}

TEST_CASE("compress.random_k.every_rank_draws_the_same_mask") {
  const int world = 3;
  std::vector<std::vector<float>> out(world);
  run_world(world, [&](int r, collective& c) {
    masked_codec codec(0.1, 42);
    for (int step = 0; step < 3; ++step) {
      auto g = random_vec(500, static_cast<unsigned>(r * 10 + step));
      std::vector<tensor_ref> t{{g.data(), {500}}};
      codec.reduce(t, c);
      out[static_cast<std::size_t>(r)] = g;
    }
    CHECK(codec.bytes().ratio() == doctest::Approx(10.0));
  });
  for (std::size_t i = 0; i < 500; ++i) CHECK((out[0][i] == 0.0f) == (out[2][i] == 0.0f));
}

TEST_CASE("compress.topk.sends_the_largest_and_keeps_the_rest") {
  run_world(2, [&](int r, collective& c) {
    topk_codec codec(0.25);
    std::vector<float> g = r == 0 ? std::vector<float>{5, -1, 0.5, 0} : std::vector<float>{0, 0, -7, 1};
    std::vector<tensor_ref> t{{g.data(), {4}}};
    codec.reduce(t, c);
    // rank 0 sends index 0 (5), rank 1 index 2 (-7); mean over 2 ranks.
    CHECK(g == std::vector<float>{2.5f, 0.0f, -3.5f, 0.0f});
    CHECK(codec.bytes().sent == 8);
    CHECK(codec.bytes().dense == 16);
    // Next step with zero gradient: the residuals come out, largest first.
    std::vector<float> z{0, 0, 0, 0};
    std::vector<tensor_ref> tz{{z.data(), {4}}};
    codec.reduce(tz, c);
    if (r == 0) CHECK(z[1] == doctest::Approx(-0.5f));  // rank 0's next largest: -1 at index 1, rank 1's: 1 at 3
    CHECK(z[3] == doctest::Approx(0.5f));
  });
}

TEST_CASE("compress.half.rounds_like_ieee_and_feeds_back_the_rounding") {
  using dra::compress::detail::from_bf16;
  using dra::compress::detail::from_fp16;
  using dra::compress::detail::to_bf16;
  using dra::compress::detail::to_fp16;
  CHECK(to_fp16(1.0f) == 0x3c00);
  CHECK(to_fp16(-2.0f) == 0xc000);
  CHECK(to_fp16(65504.0f) == 0x7bff);
  CHECK(to_fp16(70000.0f) == 0x7c00);  // overflow to inf
  CHECK(from_fp16(to_fp16(1.0f / 3.0f)) == doctest::Approx(0.333251953125f).epsilon(1e-9));
  CHECK(from_fp16(to_fp16(5.96046448e-8f)) == 5.96046448e-8f);  // smallest subnormal
  CHECK(from_fp16(to_fp16(1e-9f)) == 0.0f);
  CHECK(to_bf16(1.0f) == 0x3f80);
  CHECK(from_bf16(to_bf16(1.00390625f)) == 1.0f);  // ties to even
  CHECK(from_bf16(to_bf16(3.14159265f)) == doctest::Approx(3.140625f));
  CHECK(std::isnan(from_bf16(to_bf16(NAN))));
  run_world(1, [&](int, collective& c) {
    half_codec codec(half_codec::format::bf16);
    double sent = 0.0;
    for (int step = 0; step < 100; ++step) {
      std::vector<float> g{1.001f};
      std::vector<tensor_ref> t{{g.data(), {1}}};
      codec.reduce(t, c);
      sent += g[0];
    }
    CHECK(sent == doctest::Approx(100.1).epsilon(1e-4));  // error feedback: nothing lost over time
    CHECK(codec.bytes().ratio() == doctest::Approx(2.0));
  });
}

TEST_CASE("compress.powersgd.recovers_a_low_rank_mean_and_compresses") {
  const int world = 2;
  const Eigen::Index rows = 64, cols = 32;
  std::vector<std::vector<float>> out(world);
  run_world(world, [&](int r, collective& c) {
    // Rank-1 gradients sharing u: the mean is rank 1, so rank 2 recovers it in one step.
    auto u = random_vec(rows, 1);
    auto v = random_vec(cols, 10u + static_cast<unsigned>(r));
    std::vector<float> g(static_cast<std::size_t>(rows * cols));
    for (Eigen::Index i = 0; i < rows; ++i)
      for (Eigen::Index j = 0; j < cols; ++j)
        g[static_cast<std::size_t>(i * cols + j)] = u[static_cast<std::size_t>(i)] * v[static_cast<std::size_t>(j)];
    std::vector<float> bias{static_cast<float>(r), 1.0f};
    std::vector<tensor_ref> t{{g.data(), {rows, cols}}, {bias.data(), {2}}};
    powersgd_codec codec(2, 5);
    codec.reduce(t, c);
    out[static_cast<std::size_t>(r)] = g;
    CHECK(bias[0] == doctest::Approx(0.5f));  // 1-D tensors go uncompressed
    CHECK(codec.bytes().sent == 4 * (2 * (rows + cols)) + 4 * 2);
    CHECK(codec.bytes().dense == 4 * (rows * cols + 2));
  });
  auto u = random_vec(rows, 1);
  auto v0 = random_vec(cols, 10), v1 = random_vec(cols, 11);
  for (Eigen::Index i = 0; i < rows; ++i)
    for (Eigen::Index j = 0; j < cols; ++j) {
      const float want =
          u[static_cast<std::size_t>(i)] * 0.5f * (v0[static_cast<std::size_t>(j)] + v1[static_cast<std::size_t>(j)]);
      CHECK(out[0][static_cast<std::size_t>(i * cols + j)] == doctest::Approx(want).epsilon(1e-3));
      CHECK(out[1][static_cast<std::size_t>(i * cols + j)] == out[0][static_cast<std::size_t>(i * cols + j)]);
    }
}

TEST_CASE("compress.powersgd.error_feedback_makes_the_average_output_unbiased") {
  run_world(2, [&](int r, collective& c) {
    const auto base = random_vec(48 * 48, 50u + static_cast<unsigned>(r));  // full rank
    powersgd_codec codec(1, 3);
    std::vector<double> total(base.size(), 0.0);
    const int steps = 400;
    for (int s = 0; s < steps; ++s) {
      auto g = base;
      std::vector<tensor_ref> t{{g.data(), {48, 48}}};
      codec.reduce(t, c);
      for (std::size_t i = 0; i < g.size(); ++i) total[i] += g[i];
    }
    const auto b0 = random_vec(48 * 48, 50), b1 = random_vec(48 * 48, 51);
    double err = 0.0, norm = 0.0;
    for (std::size_t i = 0; i < base.size(); ++i) {
      const double want = 0.5 * (b0[i] + b1[i]);
      err += (total[i] / steps - want) * (total[i] / steps - want);
      norm += want * want;
    }
    CHECK(std::sqrt(err / norm) < 0.1);  // rank 1 of a 48x48 matrix, yet the time average converges
  });
}

TEST_CASE("compress.state.round_trips_and_rejects_mismatches_unchanged") {
  run_world(1, [&](int, collective& c) {
    powersgd_codec a(2, 9);
    auto g = random_vec(32 * 16, 3);
    std::vector<tensor_ref> t{{g.data(), {32, 16}}};
    a.reduce(t, c);
    const auto bytes = a.save_state();
    powersgd_codec b(2, 1234);  // another seed: its Q comes from the state
    b.load_state(bytes);
    CHECK(b.steps() == 1);
    auto g1 = random_vec(32 * 16, 4), g2 = g1;
    std::vector<tensor_ref> t1{{g1.data(), {32, 16}}}, t2{{g2.data(), {32, 16}}};
    a.reduce(t1, c);
    b.reduce(t2, c);
    CHECK(g1 == g2);
    powersgd_codec wrong_rank(3);
    CHECK_THROWS_WITH_AS(wrong_rank.load_state(bytes), doctest::Contains("rank 2"), std::invalid_argument);
    CHECK(wrong_rank.steps() == 0);
    topk_codec other(0.1);
    CHECK_THROWS_WITH_AS(other.load_state(bytes), doctest::Contains("'powersgd'"), std::invalid_argument);
    auto cut = bytes;
    cut.resize(cut.size() / 2);
    CHECK_THROWS_WITH_AS(b.load_state(cut), doctest::Contains("truncated"), std::invalid_argument);
    b.clear_error_feedback();
    CHECK(b.steps() == 2);
    CHECK(b.error_feedback_norm1() == 0.0);
    // What a joiner receives: the shared part only (step, Q), no residual.
    CHECK(a.error_feedback_norm1() > 0.0);
    const auto shared = a.save_state(/*with_error_feedback=*/false);
    CHECK(bytes.size() - shared.size() == 8 + 4 * 32 * 16);  // the 32x16 residual (and its length) stays home
    powersgd_codec joiner(2, 77);
    joiner.load_state(shared);
    CHECK(joiner.steps() == a.steps());
    CHECK(joiner.error_feedback_norm1() == 0.0);
    CHECK(joiner.save_state(false) == shared);
  });
}

TEST_CASE("compress.make_codec.parses_specs_and_names_bad_ones") {
  CHECK(make_codec("powersgd:4")->name() == "powersgd");
  CHECK(make_codec("topk:0.01")->name() == "topk");
  CHECK(make_codec("bf16")->name() == "bf16");
  CHECK(make_codec("random:0.1")->name() == "random");
  CHECK(make_codec("masked")->name() == "masked");
  CHECK(dynamic_cast<masked_sync_codec&>(*make_codec("masked:0.8")).masks().config().max_sparsity == 0.8);
  CHECK_THROWS_WITH_AS(make_codec("masked:1.5"), doctest::Contains("max_sparsity"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make_codec("zip"), doctest::Contains("unknown codec 'zip'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(make_codec("topk:lots"), doctest::Contains("not a number"), std::invalid_argument);
  CHECK_THROWS_AS(make_codec("topk:0"), std::invalid_argument);
  CHECK_THROWS_AS(make_codec("powersgd:0"), std::invalid_argument);
}

TEST_CASE("compress.ride_along.one_all_reduce_carries_the_exact_values") {
  run_world(2, [&](int r, collective& inner) {
    std::vector<float> bias{1.0f, 2.0f};
    auto m = random_vec(32 * 16, static_cast<unsigned>(r));
    std::vector<tensor_ref> t{{m.data(), {32, 16}}, {bias.data(), {2}}};
    std::vector<float> exact{static_cast<float>(r) + 0.25f, 3.0f};
    {
      counting_collective c(inner);
      powersgd_codec codec(2, 1);
      codec.reduce_with(t, c, exact.data(), exact.size());
      CHECK(c.allreduces == 2);  // P with the bias and the exact values, then Q: not three
      CHECK(exact == std::vector<float>{1.5f, 6.0f});
      CHECK(bias[0] == doctest::Approx(1.0f));
    }
    {
      counting_collective c(inner);
      fp32_codec codec;
      exact = {1.0f, 0.0f};
      codec.reduce_with(t, c, exact.data(), exact.size());
      CHECK(c.allreduces == 1);
      CHECK(exact == std::vector<float>{2.0f, 0.0f});
    }
    {
      counting_collective c(inner);
      topk_codec codec(0.5);  // all-gathers: the exact values go in an all-reduce of their own
      exact = {1.0f, 1.0f};
      codec.reduce_with(t, c, exact.data(), exact.size());
      CHECK(c.allreduces == 1);
      CHECK(exact == std::vector<float>{2.0f, 2.0f});
    }
  });
}

namespace {
// A two-layer model's tensors on one rank: weights (shared by all ranks) and this rank's gradients.
struct tiny_model {
  std::vector<float> w1, b1, w2, g1, gb1, g2;
  tiny_model(int rank, unsigned step) {
    w1 = random_vec(40 * 30, 1);
    b1 = random_vec(30, 2);
    w2 = random_vec(30 * 10, 3);
    g1 = random_vec(40 * 30, 100u + step * 10u + static_cast<unsigned>(rank));
    gb1 = random_vec(30, 200u + step * 10u + static_cast<unsigned>(rank));
    g2 = random_vec(30 * 10, 300u + step * 10u + static_cast<unsigned>(rank));
  }
  std::vector<tensor_ref> refs() {
    return {{g1.data(), {40, 30}, w1.data()}, {gb1.data(), {30}, b1.data()}, {g2.data(), {30, 10}, w2.data()}};
  }
};
}  // namespace

TEST_CASE("compress.masked_sync.rigl_masks_from_the_dense_gradient_identical_on_every_rank") {
  const int world = 3;
  rigl_config cfg;
  cfg.every = 2;
  cfg.end_step = 100;
  cfg.alpha = 0.3;
  cfg.ramp_start = 0;
  cfg.ramp_steps = 1;  // the cubic ramp reaches max_sparsity at the first update
  cfg.max_sparsity = 0.9;
  std::vector<std::vector<std::uint8_t>> masks(world);
  std::vector<std::vector<float>> outputs(world), dense_means(world);
  std::vector<double> ratios(world);
  run_world(world, [&](int r, collective& inner) {
    masked_sync_codec codec(cfg, 42);
    codec.set_phase(r == 0 ? dra::signals::training_phase::steady : dra::signals::training_phase::fast);
    // Steps 0 and 1: dense masks (sparsity 0), every entry travels.
    for (unsigned s = 0; s < 2; ++s) {
      tiny_model m(r, s);
      auto t = m.refs();
      codec.reduce(t, inner);
    }
    CHECK(codec.masks().sparsity() == 0.0);
    CHECK(codec.bytes().ratio() == doctest::Approx(1.0));
    // Step 2: a mask update. The whole gradient travels; the output is the dense mean restricted
    // to the entries active before and after (regrown ones start at zero).
    CHECK(codec.update_next());
    tiny_model m(r, 2);
    auto t = m.refs();
    std::vector<float> dense_g1 = m.g1;
    std::vector<tensor_ref> td{{dense_g1.data(), {40, 30}}};
    fp32_codec().reduce(td, inner);  // the dense mean, for comparison
    codec.reduce(t, inner);
    CHECK(codec.masks().sparsity() == doctest::Approx(0.9));
    const auto& mask = codec.masks().mask(0);
    CHECK(std::count(mask.begin(), mask.end(), 1) == 120);
    for (std::size_t i = 0; i < mask.size(); ++i) CHECK(m.g1[i] == (mask[i] ? dense_g1[i] : 0.0f));
    masks[static_cast<std::size_t>(r)] = mask;
    CHECK(!codec.masks().sparsified(1));
    CHECK(codec.masks().sparsified(2));
    // Step 3: only the active entries of the matrices and 10 % of the bias entries travel.
    const auto before = codec.bytes();
    tiny_model m3(r, 3);
    auto t3 = m3.refs();
    std::vector<float> masked_dense = m3.g1;
    for (std::size_t i = 0; i < masked_dense.size(); ++i) masked_dense[i] = mask[i] ? masked_dense[i] : 0.0f;
    std::vector<tensor_ref> tm{{masked_dense.data(), {40, 30}}};
    fp32_codec().reduce(tm, inner);
    codec.reduce(t3, inner);
    CHECK(m3.g1 == masked_dense);  // bit for bit the masked dense all-reduce
    const auto sent = codec.bytes().sent - before.sent;
    CHECK(sent == 4 * (120 + 30 + 3));  // 10 % of 1200, 300 and 30 entries
    outputs[static_cast<std::size_t>(r)] = m3.gb1;
    ratios[static_cast<std::size_t>(r)] =
        static_cast<double>(codec.bytes().dense - before.dense) / static_cast<double>(sent);
  });
  CHECK(masks[0] == masks[1]);
  CHECK(masks[1] == masks[2]);
  CHECK(outputs[0] == outputs[2]);  // the same bias entries drawn on every rank
  CHECK(std::count_if(outputs[0].begin(), outputs[0].end(), [](float v) { return v != 0.0f; }) == 3);
  CHECK(ratios[0] == doctest::Approx(1530.0 / 153.0));  // 10x with the biases counted
}

TEST_CASE("compress.masked_sync.state_travels_and_mismatches_are_refused") {
  rigl_config cfg;
  cfg.every = 1;
  cfg.ramp_steps = 1;
  run_world(1, [&](int, collective& c) {
    masked_sync_codec a(cfg, 5);
    for (unsigned s = 0; s < 3; ++s) {
      tiny_model m(0, s);
      auto t = m.refs();
      a.reduce(t, c);
    }
    CHECK(a.masks().sparsity() == doctest::Approx(0.9));
    const auto shared = a.save_state(false);
    masked_sync_codec b(cfg, 5);
    b.load_state(shared);
    CHECK(b.steps() == 3);
    CHECK(b.masks().mask(0) == a.masks().mask(0));
    CHECK(b.masks().sparsity() == a.masks().sparsity());
    CHECK(b.save_state(false) == shared);
    rigl_config other = cfg;
    other.max_sparsity = 0.5;
    masked_sync_codec d(other, 5);
    CHECK_THROWS_WITH_AS(d.load_state(shared), doctest::Contains("sparsity configuration"), std::invalid_argument);
    CHECK(d.steps() == 0);
    // Without weights the mask update is refused by name.
    masked_sync_codec e(cfg, 5);
    tiny_model m(0, 0);
    auto t = m.refs();
    e.reduce(t, c);
    t[0].weights = nullptr;
    const auto before = e.save_state();
    CHECK_THROWS_WITH_AS(e.reduce(t, c), doctest::Contains("weights"), std::invalid_argument);
    CHECK(e.save_state() == before);  // nothing changed
  });
}

TEST_CASE("compress.remap_tensors.state_follows_each_tensor_when_the_list_changes") {
  // A parameter unfrozen between steps enters the list reduced (the controller's bucket): each
  // tensor's error feedback and mask stay its own; the new one starts fresh. Without the remap the
  // codec refused the next step ("tensor 1 has 7 elements, the codec saw 30").
  run_world(1, [&](int, collective& c) {
    topk_codec topk(0.1);
    tiny_model m(0, 0);
    auto t = m.refs();
    topk.reduce(t, c);
    const double carried = topk.error_feedback_norm1();
    CHECK(carried > 0.0);
    std::vector<float> fresh(7, 1.0f);
    topk.remap_tensors({0, -1, 1, 2}, {{40, 30}, {7}, {30}, {30, 10}});
    CHECK(topk.error_feedback_norm1() == doctest::Approx(carried));  // moved, not dropped
    tiny_model m1(0, 1);
    std::vector<tensor_ref> t1{m1.refs()[0], {fresh.data(), {7}}, m1.refs()[1], m1.refs()[2]};
    CHECK_NOTHROW(topk.reduce(t1, c));
    CHECK_THROWS_AS(topk.remap_tensors({0}, {{1}, {2}}), std::invalid_argument);

    rigl_config cfg;
    cfg.every = 1;
    cfg.ramp_steps = 1;
    cfg.max_sparsity = 0.9;
    masked_sync_codec masked(cfg, 3);
    for (unsigned s = 0; s < 2; ++s) {  // step 1 updates the masks to 90 %
      tiny_model mm(0, s);
      auto tt = mm.refs();
      masked.reduce(tt, c);
    }
    const auto w2_mask = masked.masks().mask(2);
    CHECK(std::count(w2_mask.begin(), w2_mask.end(), 1) == 30);
    const auto version = masked.masks().version();
    masked.remap_tensors({-1, 2}, {{5, 5}, {30, 10}});  // w1 and b1 frozen, a new 5x5 matrix
    CHECK(masked.masks().version() != version);
    CHECK(masked.masks().mask(1) == w2_mask);
    CHECK(masked.masks().mask(0) == std::vector<std::uint8_t>(25, 1));  // starts full, as fit() starts it
  });
}

TEST_CASE("compress.rigl.the_phase_rule_settles_below_the_level_that_diverged") {
  // The phase rule alone cycled: a rise to 0.6 bumped the loss, "diverging" took it down by
  // step_down twice to 0, and once steady it climbed to 0.6 again. Now a divergence right after a
  // rise undoes that rise and caps later rises there; a divergence at a level held before still
  // takes step_down (and caps nothing).
  using dra::signals::training_phase;
  rigl_config cfg;
  cfg.every = 1;
  cfg.max_sparsity = 0.8;
  cfg.step_up = 0.2;
  cfg.step_down = 0.3;
  rigl_masks masks(cfg, 3);
  masks.fit({{20, 10}});
  std::vector<float> w(200), g(200);
  for (int i = 0; i < 200; ++i) w[i] = static_cast<float>(i % 17) + 1.0f, g[i] = static_cast<float>(i % 13);
  std::int64_t step = 0;
  auto next = [&](training_phase phase) {
    const double target = masks.proposal(++step, phase);
    masks.update(step, target, {w.data()}, {g.data()});
    return masks.sparsity();
  };
  CHECK(next(training_phase::fast) == 0.0);  // dense while learning fast
  CHECK(next(training_phase::steady) == doctest::Approx(0.2));
  CHECK(next(training_phase::plateau) == doctest::Approx(0.4));
  CHECK(next(training_phase::steady) == doctest::Approx(0.6));
  CHECK(masks.ceiling() == doctest::Approx(0.8));
  CHECK(next(training_phase::diverging) == doctest::Approx(0.4));  // the rise undone, not 0.6 - 0.3
  CHECK(masks.ceiling() == doctest::Approx(0.4));
  CHECK(next(training_phase::diverging) == doctest::Approx(0.1));  // still diverging: step_down
  CHECK(masks.ceiling() == doctest::Approx(0.4));                  // a fall after a fall caps nothing new
  CHECK(next(training_phase::steady) == doctest::Approx(0.3));
  CHECK(next(training_phase::steady) == doctest::Approx(0.4));
  CHECK(next(training_phase::plateau) == doctest::Approx(0.4));  // held at the ceiling
  CHECK(next(training_phase::steady) == doctest::Approx(0.4));
  // The ceiling travels with the state (a joiner proposes what the members propose).
  detail::writer out;
  masks.save(out);
  detail::reader in{out.out};
  const rigl_masks back = masks.loaded(in);
  CHECK(back.ceiling() == doctest::Approx(0.4));
  CHECK(back.proposal(step + 1, training_phase::steady) == doctest::Approx(0.4));
  // The cubic ramp ignores the ceiling: a fixed schedule.
  rigl_config ramp = cfg;
  ramp.ramp_steps = 10;
  rigl_masks ramped(ramp, 3);
  CHECK(ramped.proposal(10, training_phase::diverging) == doctest::Approx(0.8));
}
