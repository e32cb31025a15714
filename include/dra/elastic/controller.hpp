#pragma once
// The elastic data-parallel controller (DESIGN.md §3.3), part of dra::dra (needs LibTorch).
// One per process. It is the whole protocol of an elastic world: membership over the job's c10d
// store, the decision engine on the leader, the per-epoch communicator (a dra::comm::backend,
// Gloo by default), the chunked state handoff to joiners, exactly-once data through the
// elastic_sampler, and crash recovery. Python's dra.elastic drives this same class; a LibTorch
// trainer uses it directly (examples/cpp/elastic_train.cpp).
//
// A training step, as the trainer sees it:
//   1. take sampler.indices(), forward, backward;
//   2. ok = controller.reduce_gradients(params)  (one all-reduce: gradients averaged over the
//      step's global batch, as DDP does; false when a peer failed);
//   3. if ok: optimizer.step() (and scheduler), else skip them: the step is redone;
//   4. controller.step(loss)  (commits, decides, resizes or recovers at this step boundary).
// The loss of a step travels in the next step's gradient all-reduce (it is only known to the
// controller at step()), so the engine sees the world-mean loss one step late: no extra
// collective per step.
//
// Store keys (under "dra/<job>/<restart>/"): cfg/<uid>, sig/<uid> (config and model signature,
// compared at start), universe, late_uid, epoch_seq, pg/<epoch>/... (the communicator's
// rendezvous), dec/<epoch> (a leader's decision, flagged in the next gradient all-reduce so
// steps without a resize never touch the store), cands + waiting/<uid> + admit/<uid>
// (candidates and their admission or rejection), fault/<epoch>/{alive/<uid>,decider,result}
// (survivors' agreement after a failure), done (the job finished).
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

#include "dra/comm/communicator.hpp"
#include "dra/elastic/sampler.hpp"
#include "dra/engine.hpp"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace dra::elastic {

/// Name, shape and dtype of one tensor of the model: what a joiner must match.
struct tensor_spec {
  std::string name;
  std::vector<std::int64_t> shape;
  std::string dtype;
  bool operator==(const tensor_spec& o) const { return name == o.name && shape == o.shape && dtype == o.dtype; }
};

/// A readable description of the first difference between two model signatures ("" when equal).
std::string signature_mismatch(const std::vector<tensor_spec>& world, const std::vector<tensor_spec>& joiner);

/// What the controller hands over to joiners: the trainer's state. The controller moves the
/// bytes (manifest, then the tensors in bounded chunks) and adds its own part (step counter,
/// sampler position); the provider says what the state is and loads it.
class state_provider {
 public:
  virtual ~state_provider() = default;
  /// The model's parameters and buffers (name, shape, dtype), compared at start and admission.
  virtual std::vector<tensor_spec> signature() = 0;
  /// Sender: every tensor to hand over (contiguous CPU tensors) and an opaque manifest that
  /// describes them and carries the non-tensor state.
  struct snapshot {
    std::vector<at::Tensor> tensors;
    std::string manifest;
  };
  virtual snapshot collect() = 0;
  /// Receiver: the destinations for a manifest (contiguous CPU tensors of the sender's shapes and
  /// dtypes; may alias the model's own storage, so bytes land in place).
  virtual std::vector<at::Tensor> prepare(const std::string& manifest) = 0;
  /// Receiver: every byte arrived in `tensors`; load them (and the manifest's other state).
  virtual void load(const std::string& manifest, const std::vector<at::Tensor>& tensors) = 0;
  /// AdaScale-style batch change (batch_mode::adascale): multiply the learning rate by `factor`.
  /// Called on every member at the same step boundary, before state goes to joiners.
  virtual void scale_learning_rate(double factor) = 0;
};

/// State provider of a LibTorch trainer: the module's parameters and buffers (received in place)
/// and the optimizer's state (serialised with torch::serialize into the manifest), plus the torch
/// CPU RNG state.
class module_state final : public state_provider {
 public:
  /// Both must outlive the controller. `optimizer` may be null (plain parameter updates).
  module_state(torch::nn::Module& module, torch::optim::Optimizer* optimizer);
  std::vector<tensor_spec> signature() override;
  snapshot collect() override;
  std::vector<at::Tensor> prepare(const std::string& manifest) override;
  void load(const std::string& manifest, const std::vector<at::Tensor>& tensors) override;
  void scale_learning_rate(double factor) override;

 private:
  torch::nn::Module& module_;
  torch::optim::Optimizer* optimizer_;
};

/// Where this process stands.
enum class role { candidate, member, released, finished, rejected };
const char* to_string(role r) noexcept;

/// How the process learns its place in the job: by default from torchrun's environment.
struct launch_info {
  std::string store_host;      ///< empty: a private store on a free port, a world of one
  int store_port = 0;
  bool host_store = false;     ///< this process hosts the TCPStore (rank 0 outside torchrun)
  bool join = false;           ///< a late joiner (DRA_JOIN=1): takes a uid from 10000 up
  int uid = 0;                 ///< RANK
  int universe_size = 1;       ///< WORLD_SIZE: processes launched together
  std::string job_prefix = "dra/job/0/";
  /// DRA_STORE=host:port (a dedicated store, which outlives every process) else
  /// MASTER_ADDR/MASTER_PORT, RANK, WORLD_SIZE, DRA_JOIN, DRA_JOB_ID (else TORCHELASTIC_RUN_ID),
  /// TORCHELASTIC_RESTART_COUNT. Under torchrun the agent hosts the store (or rank 0 when the
  /// agent does not share it); outside torchrun rank 0 hosts it only with DRA_HOST_STORE=1.
  static launch_info from_env();
};

enum class release_mode { standby, exit };
enum class batch_mode { fixed, adascale };

class controller;

struct controller_options {
  /// Policy, estimator, limits (min/max size, cooldown, ...), throughput model. Its
  /// decide_every is ignored: the controller decides every `decide_every` committed steps.
  engine_config engine;
  int start_size = -1;  ///< -1: every process launched
  release_mode release = release_mode::standby;
  batch_mode batch = batch_mode::fixed;
  std::int64_t decide_every = 10;
  std::map<std::int64_t, int> schedule;  ///< {committed steps: size}: a resize asked for at a step
  /// Collective timeout and the survivors' check-in window; a new world's rendezvous gets twice
  /// this (joiners may be slower to arrive than a step).
  std::chrono::milliseconds fault_timeout{3000};
  std::chrono::milliseconds store_timeout{30000};  ///< connecting to and reading from the store
  std::size_t chunk_bytes = 16u << 20;  ///< state handoff chunk: memory bound beyond the state
  bool verify = false;  ///< after every world change, compare a digest of every state tensor
  std::string events_path;      ///< JSON lines, written by the leader ("" = none)
  std::int64_t status_every = 0;  ///< a status line on rank 0 every N steps (0 = never)
  int max_resize_retries = 3;
  /// Extra configuration every process must agree on (Python adds its own options here).
  std::string config_fingerprint;
  /// Test hook: called at "rebuild", "state_transfer" and "reshard" of every world change (also
  /// while the constructor forms the first world), so tests can kill a process inside a resize.
  std::function<void(const std::string& phase, const controller& self)> phase_hook;
  /// Gloo device address when no backend is passed (empty: GLOO_SOCKET_IFNAME or c10d's default).
  std::string gloo_hostname;

  void validate() const;
};

/// What step() reports.
struct step_result {
  bool committed = false;   ///< this step's update was applied everywhere and its samples consumed
  std::int64_t step = -1;   ///< index of the committed step
  double loss = 0.0;        ///< the world's mean loss of the step (NaN when not known)
  std::string event;        ///< the JSON of a world change at this boundary ("" when none)
  bool exit_requested = false;  ///< released with release_mode::exit: the process should exit 0
};

class controller {
 public:
  /// Connects to the store, checks that every process has the same configuration and model,
  /// then forms the first world (uids < start_size) or waits as a candidate until admitted (or
  /// the job ends). Throws std::invalid_argument for bad options, dra::timeout_error naming the
  /// address when the store cannot be reached, dra::state_mismatch_error for a different model.
  controller(controller_options options, launch_info launch, std::shared_ptr<state_provider> state,
             std::shared_ptr<elastic_sampler> sampler, std::shared_ptr<comm::backend> backend = nullptr);
  ~controller();
  controller(const controller&) = delete;
  controller& operator=(const controller&) = delete;

  /// After backward: averages the gradients over the step's global batch (each rank's gradient
  /// weighted by its share of the samples; a parameter without a gradient counts as zero) in one
  /// all-reduce that also carries the previous step's loss and the leader's decision flag.
  /// Returns false when the reduction failed (a peer died or hung): the trainer must not apply
  /// this step; step() then recovers and the step is redone.
  bool reduce_gradients(const std::vector<at::Tensor>& params);
  /// The step boundary: commits the step, feeds the engine, applies a decision (resize) or
  /// recovers from a failure. `loss` is this rank's mean loss over its share of the step. A
  /// released process waits here (standby) until admitted again. Throws std::logic_error when
  /// no gradient reduction ran since the last step (the model was not wrapped).
  step_result step(double loss);
  /// Training loop helper: true while this process is a member and `num_epochs` are not done;
  /// moves the sampler to the next epoch when the current one is exhausted. When it returns
  /// false the job is finished for this process (finish() was called).
  bool next_epoch(std::int64_t num_epochs);
  /// End of training: members meet once more; the leader tells the standby processes to go.
  void finish();

  role current_role() const noexcept { return role_; }
  bool is_member() const noexcept { return role_ == role::member; }
  bool failed() const noexcept { return !failure_.empty(); }
  int uid() const noexcept { return uid_; }
  int rank() const noexcept;
  int world_size() const noexcept;
  std::int64_t epoch() const noexcept { return epoch_; }
  std::int64_t step_index() const noexcept { return step_index_; }
  std::int64_t resizes() const noexcept { return resizes_; }
  int universe_size() const noexcept { return universe_size_; }
  int start_size() const noexcept { return start_size_; }
  const std::vector<int>& members() const noexcept { return members_; }
  std::optional<std::uint64_t> last_digest() const noexcept { return last_digest_; }
  const std::string& last_event() const noexcept { return last_event_; }
  /// Every event this process emitted (JSON objects), oldest first.
  const std::vector<std::string>& events() const noexcept { return events_; }
  double last_loss() const noexcept { return last_loss_; }
  /// Candidates registered on the store (standby and late joiners), read now.
  std::vector<int> registered_candidates();
  std::string store_address() const;
  resize_engine& engine() noexcept { return engine_; }
  elastic_sampler& sampler() noexcept { return *sampler_; }
  comm::communicator* communicator() noexcept { return comm_.get(); }
  void set_num_epochs(std::int64_t n) noexcept { num_epochs_ = n; }
  /// Digest (62 bits) of the state tensors the provider hands over: equal on every rank after a
  /// world change (checked when options.verify).
  std::uint64_t state_digest();

  class store_client;  // bounded, error-mapped store operations (src/elastic/store_client.cpp)

 private:
  struct decision;
  void check_consistency();
  void wait_for_admission();
  void enter_world(std::int64_t epoch, const std::vector<int>& members, const std::string& source,
                   const std::vector<int>& joined, const std::vector<int>& left, const std::string& reason, int before,
                   double t_agree, const std::vector<int>& receivers, std::int64_t decided_step);
  void send_state(const std::vector<int>& dst_ranks, std::uint64_t& nbytes);
  void recv_state(int src, std::uint64_t& nbytes);
  std::vector<int> candidates();
  void leader_decides();
  void apply_decision();
  void leave(bool exit);
  void recover(std::string reason);
  void emit(const std::string& json);
  void hook(const char* phase);

  controller_options options_;
  std::shared_ptr<state_provider> state_;
  std::shared_ptr<elastic_sampler> sampler_;
  std::shared_ptr<comm::backend> backend_;
  std::unique_ptr<store_client> store_;
  std::unique_ptr<comm::communicator> comm_;
  resize_engine engine_;
  int uid_ = 0;
  int universe_size_ = 1;
  int start_size_ = 1;
  bool joined_late_ = false;
  role role_ = role::candidate;
  std::vector<int> members_;
  std::int64_t epoch_ = -1;
  std::int64_t step_index_ = 0;
  std::int64_t resizes_ = 0;
  std::int64_t num_epochs_ = -1;
  std::string failure_;
  bool reduced_ = false;
  bool exit_requested_ = false;
  at::Tensor flat_;
  double pending_loss_sum_ = 0.0;
  double pending_count_ = 0.0;
  double last_loss_;
  std::unique_ptr<decision> pending_;
  bool decision_flag_ = false;
  double decide_s_ = 0.0;
  std::optional<std::uint64_t> last_digest_;
  std::string last_event_;
  std::vector<std::string> events_;
  std::string signature_json_;
  std::vector<tensor_spec> signature_;
  std::vector<int> candidates_cache_;
  std::chrono::steady_clock::time_point candidates_read_{};
  // status line
  double status_t_ = 0.0;
  std::int64_t status_samples_ = 0;
};

}  // namespace dra::elastic
