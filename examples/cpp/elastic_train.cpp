// A LibTorch trainer whose data-parallel world grows and shrinks in place, driven by
// dra::elastic::controller: the same controller (store protocol, decision engine, Gloo world per
// epoch, chunked state handoff, exactly-once data, crash recovery) that Python's dra.elastic uses.
//
//   dra run --nproc-per-node 3 --no-python dra_elastic_train --epochs 3 --start-size 2 \
//       --schedule 20:3,40:2 --verify --events events.jsonl      (or torchrun --no-python ...)
//
// The controller's options come from DRA_OPTIONS (what `dra run --options` or a device pool sets,
// the option names of Python) and from the flags below, which win.
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
// Test hooks (test_hooks.hpp): --log-samples DIR writes the records the tests and the fault
// campaign (python -m dra.bench faults) check from outside: each rank's share of every step attempt,
// written before the step's gradient reduction, tagged with the world epoch (the latest world
// epoch that committed a step is the one whose shares count), the commits, the world changes, the
// final state digest. --test-fault ACTION:WHERE:INDEX[:SECONDS] makes this process kill itself or
// stall inside a phase of a world change, at the start of a step, or between a step's reduction and
// its step boundary. --compute-ms N stands for a model's compute (each step lasts N ms longer);
// --wait-candidates N makes the first world wait until N candidates registered (so that a scheduled
// grow finds them).
#include <torch/torch.h>

#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dra/elastic/membership.hpp"
#include "dra/elastic/sampler.hpp"
#include "dra/torch/elastic/controller.hpp"
#include "test_hooks.hpp"

namespace {

struct options {
  std::int64_t epochs = 3;
  std::int64_t steps = 0;  // 0: no limit (the epochs decide)
  int start_size = 0;      // 0: every process
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
  std::string test_fault;
  std::int64_t compute_ms = 0;
  std::int64_t wait_candidates = 0;
  std::int64_t fault_timeout_ms = 3000;
  std::int64_t store_timeout_ms = 30000;
  std::map<std::int64_t, int> schedule;  // committed steps -> size
  std::set<std::string> given;           // the flags on the command line (they win over DRA_OPTIONS)
};

const char* kUsage =
    "options: --epochs N --steps N --start-size N --min-size N --max-size N --decide-every N --global-batch N "
    "--dataset N --seed N --lr X --momentum X --schedule STEP:SIZE,... --release standby|exit --verify --events PATH "
    "--fault-timeout-ms N --store-timeout-ms N --status-every N --log-samples DIR --test-fault SPEC "
    "--compute-ms N --wait-candidates N";

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
    o.given.insert(a);
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
    else if (a == "--test-fault")
      o.test_fault = value();
    else if (a == "--compute-ms")
      o.compute_ms = integer();
    else if (a == "--wait-candidates")
      o.wait_candidates = integer();
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
  if (o.compute_ms < 0) throw std::invalid_argument("--compute-ms: must be >= 0");
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
  // No SIGPIPE handling here: the controller ignores SIGPIPE when the program left it at its default
  // (a write to a dead peer's socket must fail with EPIPE, not kill the process).
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

  // The options a launcher gives the job (DRA_OPTIONS: `dra run --options`, a pool's job options)
  // first; the flags given on the command line win over them, as a Python script's keywords do.
  auto co = dra::elastic::controller_options::from_env();
  const auto flag = [&opt](const char* name) { return opt.given.count(name) > 0; };
  if (flag("--start-size")) co.start_size = opt.start_size;
  if (flag("--decide-every")) co.engine.decide_every = opt.decide_every;
  if (flag("--min-size")) co.engine.limits.min_size = opt.min_size;
  if (flag("--max-size")) co.engine.limits.max_size = opt.max_size;
  if (flag("--schedule")) co.resize_schedule = opt.schedule;
  if (flag("--release"))
    co.release = opt.release == "exit" ? dra::elastic::release_mode::exit : dra::elastic::release_mode::standby;
  if (flag("--verify")) co.verify = true;
  if (flag("--events")) co.events_path = opt.events;
  if (flag("--status-every") || co.status_every == 0) co.status_every = opt.status_every;
  if (flag("--fault-timeout-ms")) co.fault_timeout_s = static_cast<double>(opt.fault_timeout_ms) / 1000.0;
  if (flag("--store-timeout-ms")) co.store_timeout_s = static_cast<double>(opt.store_timeout_ms) / 1000.0;
  // Gloo on loopback (one host); on several nodes DRA_GLOO_HOSTNAME names this host's address.
  if (co.backend_address.empty()) co.backend_address = env_or("DRA_GLOO_HOSTNAME", "127.0.0.1");
  example::record_log records(opt.log_samples);
  example::fault_plan faults(example::parse_fault_specs(opt.test_fault), records);
  std::int64_t world_changes = 0;  // world changes this process went through (the hook's INDEX)
  if (!faults.empty()) {
    co.phase_hook = [&](dra::elastic::change_phase p, const dra::elastic::controller& self) {
      if (p == dra::elastic::change_phase::rebuild) ++world_changes;
      faults.fire(dra::elastic::to_string(p), world_changes - 1, self.uid(), self.step_index(), self.epoch());
    };
  }

  auto sampler = std::make_shared<dra::elastic::elastic_sampler>(opt.dataset, opt.global_batch, opt.seed);
  auto state = std::make_shared<dra::elastic::module_state>(model, &optimizer);
  // Blocks until this process is in the world (a candidate waits here to be admitted).
  dra::elastic::controller ctl(co, launch, state, sampler);
  const int uid = ctl.uid();
  if (opt.wait_candidates > 0 && ctl.is_member() && !launch.join && uid < ctl.start_size()) {
    // Test hook: the first world trains once the expected candidates registered (on the store only,
    // outside any collective), so that a scheduled grow finds them.
    while (static_cast<std::int64_t>(ctl.registered_candidates().size()) < opt.wait_candidates)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto record_world = [&] {
    if (!ctl.is_member()) return;
    char rss[32];
    std::snprintf(rss, sizeof rss, "%.3f", example::rss_mb());
    records.write(uid, "\"kind\": \"world\", \"epoch\": " + std::to_string(ctl.epoch()) + ", \"rank\": " +
                           std::to_string(ctl.rank()) + ", \"size\": " + std::to_string(ctl.world_size()) +
                           ", \"members\": " + example::json_list(ctl.members()) +
                           ", \"step\": " + std::to_string(ctl.step_index()) + ", \"rss_mb\": " + rss);
  };
  record_world();
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
    char rss[32];
    std::snprintf(rss, sizeof rss, "%.3f", example::rss_mb());
    records.write(uid, std::string("\"kind\": \"final\", \"member\": ") +
                           (role == std::string("member") ? "true" : "false") + ", \"step\": " +
                           std::to_string(ctl.step_index()) + ", \"digest\": " + std::to_string(ctl.state_digest()) +
                           ", \"resizes\": " + std::to_string(ctl.resizes()) + ", \"rss_mb\": " + rss);
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
      if (faults.fire("step", step, uid, step, world_epoch)) continue;  // a caught exception: the batch is skipped
      if (opt.compute_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(opt.compute_ms));
      optimizer.zero_grad();
      double loss_value = 0.0;
      if (!ids.empty()) {
        const auto index = torch::tensor(ids, torch::kLong);
        // Mean over this rank's share: the controller weights each rank's gradient by its share.
        const auto loss = torch::mse_loss(model.forward(x.index_select(0, index)), y.index_select(0, index));
        loss.backward();
        loss_value = loss.item<double>();
      }
      // The share is logged before the reduction, tagged with the world epoch: whether this process
      // then dies or the step fails and is redone in a later world, the record of the world that
      // committed the step is complete (a checker keeps the latest world epoch of each step).
      records.write(uid, "\"kind\": \"attempt\", \"step\": " + std::to_string(step) + ", \"data_epoch\": " +
                             std::to_string(data_epoch) + ", \"world_epoch\": " + std::to_string(world_epoch) +
                             ", \"rank\": " + std::to_string(rank) + ", \"world\": " + std::to_string(world) +
                             ", \"ids\": " + example::json_list(ids));
      const bool reduced = ctl.reduce_gradients(params);  // false: a peer failed, the step is redone
      // A missed ctl.step (at after_reduce, no optimizer step either): the world commits the step's
      // batches whatever this rank did with them (the next reduction catches up; the batch taken
      // before it is stale, and redone).
      const auto missed = [&](bool updated) {
        if (!reduced) return;  // a failed reduction: the step is redone, nothing was committed
        records.write(uid, "\"kind\": \"commit\", \"step\": " + std::to_string(step) + ", \"data_epoch\": " +
                               std::to_string(data_epoch) + ", \"world_epoch\": " + std::to_string(world_epoch) +
                               ", \"update\": " + (updated ? "true" : "false"));
      };
      if (faults.fire("after_reduce", step, uid, step, world_epoch)) {
        missed(false);
        continue;
      }
      if (reduced) optimizer.step();
      if (faults.fire("after_update", step, uid, step, world_epoch)) {
        missed(true);
        continue;
      }
      const bool was_member = ctl.is_member();
      const auto r = ctl.step(loss_value);
      if (reduced && (!r.committed || r.step != step))
        throw std::logic_error("a successfully reduced step was not committed as step " + std::to_string(step));
      if (r.committed)
        records.write(uid, "\"kind\": \"commit\", \"step\": " + std::to_string(step) + ", \"data_epoch\": " +
                               std::to_string(data_epoch) + ", \"world_epoch\": " + std::to_string(world_epoch));
      if (ctl.epoch() != world_epoch) record_world();
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
