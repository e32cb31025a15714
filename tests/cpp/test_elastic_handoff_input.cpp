// The state handoff's receiver against a header it did not expect (tests/python/test_security_outside.py
// has the other surfaces): the header comes from another process, so every length and count in it
// is checked before anything is sized from it or read at an index it gives. A loopback
// communicator carries what a real sender wrote; the test then changes one header entry.
#include <torch/torch.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "../../src/elastic/handoff.hpp"
#include "dra/error.hpp"

#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

namespace {

namespace ed = dra::elastic::detail;

// Every send is queued (one copy, whatever the destinations); every recv takes the next one, which
// must have the receiving tensor's size.
class loopback final : public dra::comm::communicator {
 public:
  std::deque<at::Tensor> queue;
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::uint64_t epoch() const override { return 1; }
  void all_reduce_sum(at::Tensor&) override {}
  void broadcast(at::Tensor&, int) override {}
  void barrier() override {}
  void abort() noexcept override {}
  void send(const at::Tensor& tensor, const std::vector<int>&, int) override { queue.push_back(tensor.clone()); }
  void recv(at::Tensor& tensor, int, int) override {
    if (queue.empty()) throw dra::comm_error("loopback: nothing was sent");
    at::Tensor next = queue.front();
    queue.pop_front();
    if (next.numel() != tensor.numel()) throw dra::comm_error("loopback: a message of another size");
    tensor.copy_(next.view_as(tensor));
  }
};

class tensors_state final : public dra::elastic::state_provider {
 public:
  std::vector<at::Tensor> tensors;
  std::size_t deferrable_from = static_cast<std::size_t>(-1);
  std::vector<dra::elastic::tensor_spec> signature() override { return {}; }
  snapshot collect() override { return {tensors, "manifest-v1", deferrable_from}; }
  std::vector<at::Tensor> prepare(const std::string&) override {
    std::vector<at::Tensor> out;
    for (const auto& t : tensors) out.push_back(torch::empty_like(t));
    return out;
  }
  void load(const std::string&, const std::vector<at::Tensor>& received) override { tensors = received; }
  void scale_learning_rate(double) override {}
};

// What a sender of two tensors wrote, with header entry `index` (0: the length message's one value;
// 1 + i: the header's entry i; -1: none) set to `value`, handed to a receiver of the same two tensors.
void receive_changed(bool deferred, int index, std::int64_t value) {
  loopback comm;
  auto transfer = dra::comm::make_chunked_transfer(4096);
  tensors_state src, dst;
  src.tensors = {at::arange(100, at::kFloat), at::ones({3}, at::kDouble)};
  src.deferrable_from = 1;
  dst.tensors = {at::zeros({100}, at::kFloat), at::zeros({3}, at::kDouble)};
  dst.deferrable_from = 1;
  ed::handoff_header h;
  if (deferred) comm.queue.push_back(at::ones({2}, at::kByte));  // the one receiver's answer: it lacks both
  auto sent = ed::send_state(comm, *transfer, {1}, src, h, deferred);
  if (sent.deferred) sent.deferred->wait();
  REQUIRE(comm.queue.size() >= 2);
  if (index == 0) {
    comm.queue[0].fill_(value);
  } else if (index > 0) {
    comm.queue[1][index - 1] = value;
  }
  ed::handoff_header got;
  auto r = ed::recv_state(comm, *transfer, 0, dst, got, deferred);
  if (r.deferred) r.deferred->wait();
}

}  // namespace

TEST_CASE("elastic.handoff_input.a_header_unchanged_is_received") {
  at::set_num_threads(1);
  CHECK_NOTHROW(receive_changed(false, -1, 0));
  CHECK_NOTHROW(receive_changed(true, -1, 0));
}

TEST_CASE("elastic.handoff_input.a_header_length_out_of_range_is_refused") {
  at::set_num_threads(1);
  for (const std::int64_t length : {std::int64_t{-1}, std::int64_t{0}, std::int64_t{3}, std::int64_t{1} << 40})
    CHECK_THROWS_AS(receive_changed(false, 0, length), dra::state_mismatch_error);
}

TEST_CASE("elastic.handoff_input.negative_or_huge_part_sizes_are_refused") {
  at::set_num_threads(1);
  // A negative manifest size that a larger controller part makes up for: the same total bytes.
  CHECK_THROWS_AS(receive_changed(false, 2, -5), dra::state_mismatch_error);
  CHECK_THROWS_AS(receive_changed(false, 3, std::int64_t{1} << 50), dra::state_mismatch_error);
}

TEST_CASE("elastic.handoff_input.a_tensor_count_the_header_does_not_hold_is_refused") {
  at::set_num_threads(1);
  // Four tensors named in a header with room for two sizes: the receiver would read past it.
  CHECK_THROWS_AS(receive_changed(false, 4, 4), dra::state_mismatch_error);
}

TEST_CASE("elastic.handoff_input.a_first_deferrable_tensor_past_the_last_is_refused") {
  at::set_num_threads(1);
  // Header entries: 4 fixed, 2 sizes, then the first deferrable (entry 6, message index 7).
  CHECK_NOTHROW(receive_changed(true, 7, 1));
  CHECK_THROWS_AS(receive_changed(true, 7, std::int64_t{1} << 40), dra::state_mismatch_error);
  CHECK_THROWS_AS(receive_changed(true, 7, -1), dra::state_mismatch_error);
}
