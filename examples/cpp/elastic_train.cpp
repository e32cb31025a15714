// A LibTorch trainer whose data-parallel world grows and shrinks in place, using dra's C++ parts:
// dra::comm::gloo_backend (one Gloo group per world epoch), dra::resize_engine (the decision
// engine, on the leader) and the membership functions of dra/elastic/membership.hpp.
//
//   torchrun --no-python --nproc-per-node=3 --max-restarts=0 dra_elastic_train
//       --steps 60 --start-size 2 --schedule 20:3,40:2
//
// Every process started is a member of the universe (uid = RANK). Processes 0..start_size-1
// form the first world; the others stand by. Every `decide_every` steps the leader (rank 0,
// uid 0: the leader never leaves) feeds the engine and publishes the decision under the store
// key <prefix>/dec/<k>; every process (members and standbys) reads it, so all agree on the next
// member list. Members then rebuild the Gloo world, joiners receive the parameters from rank 0,
// and the next step's samples are split over the new world. Released members stand by again.
// This store protocol is a second, simpler implementation of the one in python/dra/elastic/
// (no fault recovery, no optimizer-state handoff: plain SGD has none).
#include <torch/torch.h>

#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "dra/comm/gloo.hpp"
#include "dra/elastic/membership.hpp"
#include "dra/engine.hpp"

namespace {

struct options {
  std::int64_t steps = 60;
  int start_size = -1;  // -1: every process
  std::int64_t decide_every = 10;
  std::int64_t global_batch = 32;
  std::int64_t dataset = 512;
  std::int64_t status_every = 10;
  double lr = 0.05;
  std::chrono::milliseconds timeout{30000};
  std::map<std::int64_t, int> schedule;  // completed steps -> size (overrides the engine there)
};

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + ": needs a value");
      return argv[++i];
    };
    if (a == "--steps")
      o.steps = std::stoll(value());
    else if (a == "--start-size")
      o.start_size = std::stoi(value());
    else if (a == "--decide-every")
      o.decide_every = std::stoll(value());
    else if (a == "--global-batch")
      o.global_batch = std::stoll(value());
    else if (a == "--status-every")
      o.status_every = std::stoll(value());
    else if (a == "--lr")
      o.lr = std::stod(value());
    else if (a == "--timeout-ms")
      o.timeout = std::chrono::milliseconds(std::stoll(value()));
    else if (a == "--schedule") {
      // "20:3,40:2": at the decision after 20 steps go to 3 ranks, after 40 steps to 2.
      std::stringstream ss(value());
      std::string item;
      while (std::getline(ss, item, ',')) {
        const auto colon = item.find(':');
        if (colon == std::string::npos)
          throw std::invalid_argument("--schedule: expected step:size, got '" + item + "'");
        o.schedule[std::stoll(item.substr(0, colon))] = std::stoi(item.substr(colon + 1));
      }
    } else {
      throw std::invalid_argument("unknown option " + a +
                                  " (options: --steps --start-size --decide-every --global-batch --status-every --lr "
                                  "--timeout-ms --schedule)");
    }
  }
  if (o.decide_every < 1) throw std::invalid_argument("--decide-every: must be >= 1");
  for (const auto& [step, size] : o.schedule)
    if (step <= 0 || step % o.decide_every != 0)
      throw std::invalid_argument("--schedule: " + std::to_string(step) +
                                  " is not a decision point (decisions come after a multiple of --decide-every steps)");
  return o;
}

struct mlp : torch::nn::Module {
  mlp()
      : fc1(register_module("fc1", torch::nn::Linear(8, 32))), fc2(register_module("fc2", torch::nn::Linear(32, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2->forward(torch::tanh(fc1->forward(x))); }
  torch::nn::Linear fc1, fc2;
};

// FNV-1a over the parameters' bytes: equal hashes mean bit-identical parameters.
std::uint64_t params_hash(torch::nn::Module& m) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& p : m.parameters()) {
    const auto t = p.detach().contiguous();
    const auto* b = static_cast<const unsigned char*>(t.data_ptr());
    for (std::size_t i = 0; i < t.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  return h;
}

// All parameters (or their gradients) in one flat buffer, so a step costs one collective.
torch::Tensor flatten(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> flat;
  for (const auto& t : ts) flat.push_back(t.reshape({-1}));
  return torch::cat(flat);
}
void unflatten_into(const torch::Tensor& flat, const std::vector<torch::Tensor>& ts) {
  torch::NoGradGuard no_grad;
  std::int64_t off = 0;
  for (const auto& t : ts) {
    t.copy_(flat.slice(0, off, off + t.numel()).view_as(t));
    off += t.numel();
  }
}

// The leader's decision as a store value: "<epoch>;<members, comma-separated>;<done>;<reason>".
struct decision_record {
  std::uint64_t epoch = 0;
  std::vector<int> members;
  bool done = false;
  std::string reason;
};
std::string encode(const decision_record& d) {
  std::string s = std::to_string(d.epoch) + ";";
  for (std::size_t i = 0; i < d.members.size(); ++i) s += (i ? "," : "") + std::to_string(d.members[i]);
  return s + ";" + (d.done ? "1" : "0") + ";" + d.reason;
}
decision_record decode(const std::string& s) {
  decision_record d;
  std::stringstream ss(s);
  std::string epoch, members, done;
  std::getline(ss, epoch, ';');
  std::getline(ss, members, ';');
  std::getline(ss, done, ';');
  std::getline(ss, d.reason);
  d.epoch = std::stoull(epoch);
  std::stringstream ms(members);
  std::string id;
  while (std::getline(ms, id, ',')) d.members.push_back(std::stoi(id));
  d.done = done == "1";
  return d;
}
std::string to_string(const std::vector<int>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

int main(int argc, char** argv) try {
  const options opt = parse(argc, argv);
  const int uid = std::stoi(env_or("RANK", "0"));
  const int universe = std::stoi(env_or("WORLD_SIZE", "1"));
  const int start_size = opt.start_size < 0 ? universe : opt.start_size;
  if (start_size < 1 || start_size > universe)
    throw std::invalid_argument("--start-size: must lie in [1, WORLD_SIZE=" + std::to_string(universe) + "]");

  // torchrun's agent hosts the store (TORCHELASTIC_USE_AGENT_STORE=True); a job started by
  // hand lets rank 0 host it.
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(std::stoi(env_or("MASTER_PORT", "29500")));
  so.isServer = env_or("TORCHELASTIC_USE_AGENT_STORE", "False") != "True" && uid == 0;
  so.waitWorkers = false;
  so.timeout = std::chrono::seconds(300);  // standbys wait for the next decision this long
  auto tcp = c10::make_intrusive<c10d::TCPStore>(env_or("MASTER_ADDR", "127.0.0.1"), so);
  const std::string job = "dra_cpp/" + env_or("TORCHELASTIC_RUN_ID", "local");
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::PrefixStore>(job, tcp);

  dra::comm::gloo_backend_options bo;
  bo.hostname = env_or("DRA_GLOO_HOSTNAME", "127.0.0.1");
  bo.key_prefix = "pg";
  dra::comm::gloo_backend backend(bo);

  // Same seed everywhere: the data and the initial model are identical on every process.
  torch::manual_seed(0);
  mlp model;  // constructed after the data: the seed sequence is the same on every process
  const auto params = model.parameters();
  torch::manual_seed(1234);
  const torch::Tensor x = torch::randn({opt.dataset, 8});
  const torch::Tensor w_true = at::linspace(-1.0, 1.0, 8);
  const torch::Tensor y = torch::sin(x.matmul(w_true)).unsqueeze(1);

  // The engine runs on the leader only; the others never read it.
  dra::engine_config ec;
  ec.decide_every = opt.decide_every;
  ec.limits.min_size = 1;
  ec.limits.max_size = universe;
  dra::resize_engine engine(ec);
  engine.capacity().available = universe;
  engine.resized(start_size, static_cast<double>(opt.global_batch));

  std::vector<int> members;
  for (int i = 0; i < start_size; ++i) members.push_back(i);
  std::uint64_t epoch = 1;
  std::unique_ptr<dra::comm::communicator> comm;
  if (dra::elastic::rank_of(members, uid) >= 0) {
    dra::comm::rebuild_request r;
    r.epoch = epoch;
    r.new_members = members;
    r.self = uid;
    r.timeout = opt.timeout;
    comm = backend.rebuild(nullptr, r, store);
    torch::Tensor flat = flatten(params).detach();
    comm->broadcast(flat, 0);
    unflatten_into(flat, params);
  }
  std::printf("[dra-cpp] uid %d starts as %s (world %zu)\n", uid, comm ? "member" : "standby", members.size());
  std::fflush(stdout);

  std::int64_t step = 0, cursor = 0, data_epoch = 0, resizes = 0;
  std::vector<std::int64_t> order = dra::elastic::epoch_order(opt.dataset, 0, data_epoch);
  while (step < opt.steps) {
    if (comm) {
      // One step: this rank's share of the global batch, summed loss, one all-reduce of the
      // gradients plus [loss sum, sample count].
      const auto batch = dra::elastic::step_batch(cursor, opt.global_batch, opt.dataset);
      const auto share = dra::elastic::rank_share(batch, comm->size(), comm->rank());
      const auto t0 = std::chrono::steady_clock::now();
      model.zero_grad();
      torch::Tensor loss_sum = torch::zeros({});
      if (share.size() > 0) {
        std::vector<std::int64_t> idx(order.begin() + share.begin, order.begin() + share.end);
        const auto index = torch::tensor(idx, torch::kLong);
        loss_sum = at::mse_loss(model.forward(x.index_select(0, index)), y.index_select(0, index), at::Reduction::Sum);
        loss_sum.backward();
      }
      std::vector<torch::Tensor> grads;
      for (const auto& p : params) grads.push_back(p.grad().defined() ? p.grad() : torch::zeros_like(p));
      torch::Tensor packet = torch::cat(
          {flatten(grads), loss_sum.detach().reshape({1}), torch::full({1}, static_cast<double>(share.size()))});
      const auto t1 = std::chrono::steady_clock::now();
      comm->all_reduce_sum(packet);
      const auto t2 = std::chrono::steady_clock::now();
      const double n = packet[-1].item<double>();
      const double mean_loss = packet[-2].item<double>() / n;
      {
        torch::NoGradGuard no_grad;
        torch::Tensor g = packet.slice(0, 0, packet.numel() - 2) / n;
        std::int64_t off = 0;
        for (const auto& p : params) {
          p.sub_(g.slice(0, off, off + p.numel()).view_as(p) * opt.lr);
          off += p.numel();
        }
      }
      if (comm->rank() == 0) {
        const double total = std::chrono::duration<double>(t2 - t0).count();
        const double sync = std::chrono::duration<double>(t2 - t1).count();
        engine.throughput().observe(comm->size(), static_cast<double>(opt.global_batch) / comm->size(), total, sync);
        engine.step(step, mean_loss);
        if (opt.status_every > 0 && (step + 1) % opt.status_every == 0)
          std::printf("[dra-cpp] step %" PRId64 " world %d loss %.5f\n", step + 1, comm->size(), mean_loss);
      }
      cursor = batch.end;
    }
    if (cursor >= opt.dataset) {  // next data epoch: a fresh global order, same on every process
      cursor = 0;
      order = dra::elastic::epoch_order(opt.dataset, 0, ++data_epoch);
    }
    ++step;
    if (step % opt.decide_every != 0 && step < opt.steps) continue;

    // Decision point (every process, members and standbys, reads the same record).
    const std::string key = step >= opt.steps ? "dec/final" : "dec/" + std::to_string(step / opt.decide_every);
    if (comm && comm->rank() == 0) {
      decision_record d;
      d.done = step >= opt.steps;
      std::vector<int> next = members;
      auto forced = opt.schedule.find(step);
      int target = static_cast<int>(members.size());
      if (!d.done) {
        if (forced != opt.schedule.end()) {
          target = std::max(1, std::min(forced->second, universe));
          d.reason = "schedule";
        } else if (engine.status().decided) {
          target = engine.status().last_decision.target_size;
          d.reason = engine.status().last_decision.reason;
        }
      }
      if (target > static_cast<int>(members.size())) {
        std::vector<int> candidates;
        for (int u = 0; u < universe; ++u)
          if (dra::elastic::rank_of(members, u) < 0) candidates.push_back(u);
        next = dra::elastic::next_members(members, {}, dra::elastic::pick_joiners(members, candidates, target));
      } else if (target < static_cast<int>(members.size())) {
        next = dra::elastic::next_members(members, dra::elastic::pick_leavers(members, target), {});
      }
      if (!d.done && engine.status().decided)
        std::printf("[dra-cpp] engine after step %" PRId64 ": %s to %d (%s)\n", step,
                    dra::policy::to_string(engine.status().last_decision.kind),
                    engine.status().last_decision.target_size, engine.status().last_decision.reason.c_str());
      d.epoch = next == members ? epoch : epoch + 1;
      d.members = next;
      const std::string value = encode(d);
      store->set(key, std::vector<std::uint8_t>(value.begin(), value.end()));
    }
    const auto raw = store->get(key);
    const decision_record d = decode(std::string(raw.begin(), raw.end()));
    if (d.done) break;
    if (d.members == members) continue;

    // Resize: members rebuild from their communicator, joiners from nothing, leavers get null.
    const std::vector<int> old_members = members;
    const bool joiner = !comm && dra::elastic::rank_of(d.members, uid) >= 0;
    if (comm || joiner) {
      dra::comm::rebuild_request r;
      r.epoch = d.epoch;
      r.old_members = old_members;
      r.new_members = d.members;
      r.self = uid;
      r.timeout = opt.timeout;
      const auto t0 = std::chrono::steady_clock::now();
      comm = backend.rebuild(std::move(comm), r, store);
      if (comm) {
        // Parameters from the leader; joiners also learn where the data cursor stands.
        torch::Tensor flat = flatten(params).detach();
        comm->broadcast(flat, 0);
        unflatten_into(flat, params);
        torch::Tensor pos = torch::tensor({cursor, data_epoch}, torch::kLong);
        comm->broadcast(pos, 0);
        cursor = pos[0].item<std::int64_t>();
        if (pos[1].item<std::int64_t>() != data_epoch) {
          data_epoch = pos[1].item<std::int64_t>();
          order = dra::elastic::epoch_order(opt.dataset, 0, data_epoch);
        }
      }
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (comm && comm->rank() == 0)
        std::printf(
            "[dra-cpp] resize after step %" PRId64 ": world %zu -> %zu members %s epoch %" PRIu64 " (%.3f s; %s)\n",
            step, old_members.size(), d.members.size(), to_string(d.members).c_str(), d.epoch, took, d.reason.c_str());
      if (!comm) std::printf("[dra-cpp] uid %d released after step %" PRId64 ", standing by\n", uid, step);
      if (joiner) std::printf("[dra-cpp] uid %d joined after step %" PRId64 " as rank %d\n", uid, step, comm->rank());
      std::fflush(stdout);
    }
    members = d.members;
    epoch = d.epoch;
    ++resizes;
    if (uid == 0) engine.resized(static_cast<int>(members.size()), static_cast<double>(opt.global_batch));
  }

  if (comm)
    std::printf("[dra-cpp] final uid %d rank %d world %d steps %" PRId64 " resizes %" PRId64 " hash %016" PRIx64 "\n",
                uid, comm->rank(), comm->size(), step, resizes, params_hash(model));
  else
    std::printf("[dra-cpp] final uid %d standby steps %" PRId64 " resizes %" PRId64 "\n", uid, step, resizes);
  std::fflush(stdout);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "[dra-cpp] error: %s\n", e.what());
  return 1;
}
