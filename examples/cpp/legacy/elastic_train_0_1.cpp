// Release 0.1.0's examples/cpp/elastic_train.cpp, unchanged below this comment (git show
// 3fb8724^:examples/cpp/elastic_train.cpp): a LibTorch trainer written against the previous
// release. It must keep compiling and running on this release through the deprecated aliases
// (docs/guide/compatibility.md); tests/python/test_cpp_compat.py builds it and runs it.

// A LibTorch trainer whose data-parallel world grows and shrinks in place, driven by
// dra::elastic::controller: the same controller (store protocol, decision engine, Gloo world per
// epoch, chunked state handoff, exactly-once data, crash recovery) that Python's dra.elastic uses.
//
//   torchrun --no-python --nproc-per-node=3 --max-restarts=0 dra_elastic_train
//       --epochs 3 --start-size 2 --schedule 20:3,40:2 --verify --events events.jsonl
//
// Every process torchrun starts is a process of the job (uid = RANK). Processes 0..start_size-1
// form the first world; the others wait as candidates inside the controller's constructor until
// the leader admits them. A joiner receives the parameters, the SGD momentum buffers, the RNG
// state, the step counter and the sampler position from rank 0, and continues at the world's
// step. Released processes stand by (--release standby) or exit 0 (--release exit).
//
// The model is an MLP on deterministic synthetic regression data (the same on every process),
// trained with torch::optim::SGD with momentum, so the optimizer state handoff matters: a joiner
// without the world's momentum buffers would drift from the others.
//
// Output, per process, on its last line (tests parse it):
//   [dra-cpp] final uid U role member|standby|released rank R world W steps S resizes N
//       hash H momentum M
// H hashes the parameters, M the momentum buffers (FNV-1a over their bytes).
//
// Test hooks: --log-samples DIR appends one JSON line per committed step to DIR/samples-<uid>.jsonl
// (the step's data epoch, index, world epoch, rank and this rank's sample ids), so exactly-once
// data can be checked from outside. --die-at-step K makes the process whose uid equals the
// environment variable DRA_TEST_DIE_UID kill itself with SIGKILL at step K, after backward and
// before the gradient all-reduce (a crash in the middle of a step); without that variable the
// option does nothing. --die-in-phase rebuild|state_transfer|reshard likewise kills that process
// inside that phase of the first world change after the start (a crash during a resize).
#include <torch/torch.h>

#include <chrono>
#include <cinttypes>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "dra/elastic/controller.hpp"
#include "dra/elastic/membership.hpp"
#include "dra/elastic/sampler.hpp"

namespace {

struct options {
  std::int64_t epochs = 3;
  std::int64_t steps = 0;  // 0: no limit (the epochs decide)
  int start_size = -1;     // -1: every process
  int min_size = 1;
  int max_size = 1 << 20;
  std::int64_t decide_every = 10;
  std::int64_t global_batch = 32;
  std::int64_t dataset = 640;
  std::int64_t status_every = 10;
  std::uint64_t seed = 0;
  double lr = 0.05;
  double momentum = 0.9;
  bool verify = false;
  std::string release = "standby";
  std::string events;
  std::string log_samples;
  std::int64_t die_at_step = -1;
  std::string die_in_phase;
  std::int64_t fault_timeout_ms = 3000;
  std::int64_t store_timeout_ms = 30000;
  std::map<std::int64_t, int> schedule;  // committed steps -> size
};

const char* kUsage =
    "options: --epochs N --steps N --start-size N --min-size N --max-size N --decide-every N --global-batch N "
    "--dataset N --seed N --lr X --momentum X --schedule STEP:SIZE,... --release standby|exit --verify --events PATH "
    "--fault-timeout-ms N --store-timeout-ms N --status-every N --log-samples DIR --die-at-step K "
    "--die-in-phase PHASE";

std::int64_t to_int(const std::string& flag, const std::string& v) {
  try {
    std::size_t used = 0;
    const auto x = std::stoll(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(flag + ": expected an integer, got '" + v + "'");
}

double to_double(const std::string& flag, const std::string& v) {
  try {
    std::size_t used = 0;
    const auto x = std::stod(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(flag + ": expected a number, got '" + v + "'");
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + ": needs a value");
      return argv[++i];
    };
    auto integer = [&] { return to_int(a, value()); };
    if (a == "--epochs")
      o.epochs = integer();
    else if (a == "--steps")
      o.steps = integer();
    else if (a == "--start-size")
      o.start_size = static_cast<int>(integer());
    else if (a == "--min-size")
      o.min_size = static_cast<int>(integer());
    else if (a == "--max-size")
      o.max_size = static_cast<int>(integer());
    else if (a == "--decide-every")
      o.decide_every = integer();
    else if (a == "--global-batch")
      o.global_batch = integer();
    else if (a == "--dataset")
      o.dataset = integer();
    else if (a == "--seed")
      o.seed = static_cast<std::uint64_t>(integer());
    else if (a == "--status-every")
      o.status_every = integer();
    else if (a == "--lr")
      o.lr = to_double(a, value());
    else if (a == "--momentum")
      o.momentum = to_double(a, value());
    else if (a == "--verify")
      o.verify = true;
    else if (a == "--release")
      o.release = value();
    else if (a == "--events")
      o.events = value();
    else if (a == "--log-samples")
      o.log_samples = value();
    else if (a == "--die-at-step")
      o.die_at_step = integer();
    else if (a == "--die-in-phase")
      o.die_in_phase = value();
    else if (a == "--fault-timeout-ms")
      o.fault_timeout_ms = integer();
    else if (a == "--store-timeout-ms")
      o.store_timeout_ms = integer();
    else if (a == "--schedule") {
      // "20:3,40:2": after 20 committed steps go to 3 processes, after 40 to 2.
      std::stringstream ss(value());
      std::string item;
      while (std::getline(ss, item, ',')) {
        const auto colon = item.find(':');
        if (colon == std::string::npos)
          throw std::invalid_argument("--schedule: expected STEP:SIZE, got '" + item + "'");
        o.schedule[to_int("--schedule", item.substr(0, colon))] =
            static_cast<int>(to_int("--schedule", item.substr(colon + 1)));
      }
    } else if (a == "--help" || a == "-h") {
      std::printf("%s\n", kUsage);
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown option " + a + " (" + kUsage + ")");
    }
  }
  if (o.release != "standby" && o.release != "exit")
    throw std::invalid_argument("--release: expected 'standby' or 'exit', got '" + o.release + "'");
  if (o.epochs < 1) throw std::invalid_argument("--epochs: must be >= 1");
  if (o.steps < 0) throw std::invalid_argument("--steps: must be >= 0 (0 = no limit)");
  if (!o.die_in_phase.empty() && o.die_in_phase != "rebuild" && o.die_in_phase != "state_transfer" &&
      o.die_in_phase != "reshard")
    throw std::invalid_argument("--die-in-phase: expected rebuild, state_transfer or reshard, got '" + o.die_in_phase +
                                "'");
  return o;
}

struct mlp : torch::nn::Module {
  mlp()
      : fc1(register_module("fc1", torch::nn::Linear(16, 64))), fc2(register_module("fc2", torch::nn::Linear(64, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2->forward(torch::tanh(fc1->forward(x))); }
  torch::nn::Linear fc1, fc2;
};

std::uint64_t fnv(std::uint64_t h, const torch::Tensor& tensor) {
  const auto t = tensor.detach().contiguous();
  const auto* b = static_cast<const unsigned char*>(t.data_ptr());
  for (std::size_t i = 0; i < t.nbytes(); ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
constexpr std::uint64_t kFnvBasis = 1469598103934665603ull;

// Equal hashes mean bit-identical parameters.
std::uint64_t params_hash(torch::nn::Module& m) {
  std::uint64_t h = kFnvBasis;
  for (const auto& p : m.parameters()) h = fnv(h, p);
  return h;
}

// The SGD momentum buffers in parameter order (a parameter without one hashes as nothing).
std::uint64_t momentum_hash(torch::optim::SGD& opt) {
  std::uint64_t h = kFnvBasis;
  for (const auto& group : opt.param_groups())
    for (const auto& p : group.params()) {
      const auto it = opt.state().find(p.unsafeGetTensorImpl());
      if (it == opt.state().end()) continue;
      const auto& s = static_cast<const torch::optim::SGDParamState&>(*it->second);
      if (s.momentum_buffer().defined()) h = fnv(h, s.momentum_buffer());
    }
  return h;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

}  // namespace

int main(int argc, char** argv) try {
  const options opt = parse(argc, argv);
  const dra::elastic::launch_info launch = dra::elastic::launch_info::from_env();

  // Same seeds everywhere: the data and the initial model are identical on every process (the
  // world's first handoff makes them bit-identical anyway).
  torch::manual_seed(1234);
  const torch::Tensor x = torch::randn({opt.dataset, 16});
  const torch::Tensor w_true = torch::linspace(-1.0, 1.0, 16);
  const torch::Tensor y = torch::sin(x.matmul(w_true)).unsqueeze(1) + 0.05 * torch::randn({opt.dataset, 1});
  torch::manual_seed(0);
  mlp model;
  const auto params = model.parameters();
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(opt.lr).momentum(opt.momentum));

  dra::elastic::controller_options co;
  co.start_size = opt.start_size;
  co.decide_every = opt.decide_every;
  co.engine.limits.min_size = opt.min_size;
  co.engine.limits.max_size = opt.max_size;
  co.schedule = opt.schedule;
  co.release = opt.release == "exit" ? dra::elastic::release_mode::exit : dra::elastic::release_mode::standby;
  co.verify = opt.verify;
  co.events_path = opt.events;
  co.status_every = opt.status_every;
  co.fault_timeout = std::chrono::milliseconds(opt.fault_timeout_ms);
  co.store_timeout = std::chrono::milliseconds(opt.store_timeout_ms);
  // Gloo on loopback (one host); on several nodes DRA_GLOO_HOSTNAME names this host's address.
  co.gloo_hostname = env_or("DRA_GLOO_HOSTNAME", "127.0.0.1");
  const std::string die_uid = env_or("DRA_TEST_DIE_UID", "");
  if (!opt.die_in_phase.empty() && !die_uid.empty()) {
    // Test hook: die inside the first world change after the start (a crash during a resize).
    co.phase_hook = [&opt, die_uid](const std::string& phase, const dra::elastic::controller& self) {
      if (phase == opt.die_in_phase && self.step_index() > 0 && std::to_string(self.uid()) == die_uid) {
        std::printf("[dra-cpp] uid %d: test hook kills this process in phase %s at step %" PRId64 "\n", self.uid(),
                    phase.c_str(), self.step_index());
        std::fflush(stdout);
        std::raise(SIGKILL);
      }
    };
  }

  auto sampler = std::make_shared<dra::elastic::elastic_sampler>(opt.dataset, opt.global_batch, opt.seed);
  auto state = std::make_shared<dra::elastic::module_state>(model, &optimizer);
  // Blocks until this process is in the world (a candidate waits here to be admitted).
  dra::elastic::controller ctl(co, launch, state, sampler);
  const int uid = ctl.uid();
  const bool die_here = opt.die_at_step >= 0 && env_or("DRA_TEST_DIE_UID", "") == std::to_string(uid);

  std::ofstream samples_log;
  if (!opt.log_samples.empty()) {
    const std::string path = opt.log_samples + "/samples-" + std::to_string(uid) + ".jsonl";
    samples_log.open(path, std::ios::app);
    if (!samples_log) throw std::runtime_error("--log-samples: cannot append to '" + path + "'");
  }
  auto report_membership = [&](bool was_member) {
    if (ctl.is_member() && !was_member)
      std::printf("[dra-cpp] uid %d joined at step %" PRId64 " as rank %d (world %d)\n", uid, ctl.step_index(),
                  ctl.rank(), ctl.world_size());
    else if (!ctl.is_member() && was_member && ctl.current_role() == dra::elastic::role::released)
      std::printf("[dra-cpp] uid %d released at step %" PRId64 "\n", uid, ctl.step_index());
    std::fflush(stdout);
  };
  if (ctl.is_member() && (launch.join || uid >= ctl.start_size()))
    report_membership(false);  // admitted after waiting as a candidate
  else
    std::printf("[dra-cpp] uid %d starts as %s (world %d)\n", uid,
                ctl.is_member() ? "member" : dra::elastic::to_string(ctl.current_role()), ctl.world_size());
  std::fflush(stdout);

  auto final_line = [&](const char* role) {
    const auto& members = ctl.members();
    std::printf("[dra-cpp] final uid %d role %s rank %d world %zu steps %" PRId64 " resizes %" PRId64
                " hash %016" PRIx64 " momentum %016" PRIx64 "\n",
                uid, role, dra::elastic::rank_of(members, uid), members.size(), ctl.step_index(), ctl.resizes(),
                params_hash(model), momentum_hash(optimizer));
    std::fflush(stdout);
  };

  bool stop = false;
  while (!stop && ctl.next_epoch(opt.epochs)) {
    while (ctl.is_member() && !sampler->exhausted()) {
      const std::vector<std::int64_t> ids = sampler->indices();
      const std::int64_t data_epoch = sampler->epoch(), world_epoch = ctl.epoch(), step = ctl.step_index();
      const int rank = ctl.rank(), world = ctl.world_size();
      optimizer.zero_grad();
      double loss_value = 0.0;
      if (!ids.empty()) {
        const auto index = torch::tensor(ids, torch::kLong);
        // Mean over this rank's share: the controller weights each rank's gradient by its share.
        const auto loss = torch::mse_loss(model.forward(x.index_select(0, index)), y.index_select(0, index));
        loss.backward();
        loss_value = loss.item<double>();
      }
      if (die_here && step == opt.die_at_step) {
        std::printf("[dra-cpp] uid %d: test hook kills this process at step %" PRId64 "\n", uid, step);
        std::fflush(stdout);
        std::raise(SIGKILL);
      }
      const bool reduced = ctl.reduce_gradients(params);  // false: a peer failed, the step is redone
      if (reduced) {
        optimizer.step();
        // A successful reduction commits at step(): logged here, so that a process killed inside
        // step() (in a world change) still has its committed share on record.
        if (samples_log.is_open()) {
          samples_log << "{\"uid\": " << uid << ", \"step\": " << step << ", \"data_epoch\": " << data_epoch
                      << ", \"world_epoch\": " << world_epoch << ", \"rank\": " << rank << ", \"world\": " << world
                      << ", \"ids\": [";
          for (std::size_t i = 0; i < ids.size(); ++i) samples_log << (i ? ", " : "") << ids[i];
          samples_log << "]}" << std::endl;  // flushed: a killed process keeps what it committed
        }
      }
      const bool was_member = ctl.is_member();
      const auto r = ctl.step(loss_value);
      if (reduced && (!r.committed || r.step != step))
        throw std::logic_error("a successfully reduced step was not committed as step " + std::to_string(step));
      if (r.exit_requested) {
        final_line("released");
        return 0;
      }
      report_membership(was_member);
      if (opt.steps > 0 && ctl.is_member() && ctl.step_index() >= opt.steps) {
        stop = true;  // every member reaches the same step index at the same boundary
        break;
      }
    }
  }
  const bool member = dra::elastic::rank_of(ctl.members(), uid) >= 0;
  if (stop) ctl.finish();
  final_line(member ? "member" : "standby");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "[dra-cpp] error: %s\n", e.what());
  return 1;
}
