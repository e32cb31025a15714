#pragma once
// The controller of one process, part of dra::dra (needs LibTorch). Alone, it turns each step into
// signals and decisions (what dra.step drives); in an elastic job it is the state machine that grows
// and shrinks the world in place by sequencing its collaborators in src/elastic/. Python's
// dra.Controller is this class. The step protocol a trainer follows, and why the loss rides one step
// late: docs/design/elastic.md.
#include <ATen/Tensor.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "dra/compress/sparsity.hpp"
#include "dra/elastic/sampler.hpp"
#include "dra/energy/energy.hpp"
#include "dra/engine.hpp"
#include "dra/torch/comm/communicator.hpp"
#include "dra/torch/elastic/bucket_hook.hpp"
#include "dra/torch/elastic/state.hpp"

namespace dra::elastic {

/// Where this process stands.
enum class role { local, candidate, member, released, finished, rejected };
const char* to_string(role r) noexcept;

/// How the process learns its place in the job: by default from torchrun's environment.
struct launch_info {
  std::string store_host;  ///< empty: a private store on a free port, a world of one
  int store_port = 0;
  bool host_store = false;               ///< this process hosts the TCPStore (rank 0 outside torchrun)
  bool join = false;                     ///< a late joiner (DRA_JOIN=1): takes a uid from 10000 up
  int join_uid = -1;                     ///< DRA_JOIN_UID: a joiner's uid its launcher claimed (-1: claim one)
  int uid = 0;                           ///< RANK: the process's launch id (not its rank in the world)
  int universe_size = 1;                 ///< WORLD_SIZE: processes launched together
  std::string job_prefix = "dra/job/0";  ///< keys live under <job_prefix>/ (c10d's PrefixStore adds the "/")
  /// DRA_STORE=host:port (a dedicated store, which outlives every process) else
  /// MASTER_ADDR/MASTER_PORT, RANK, WORLD_SIZE, DRA_JOIN (DRA_JOIN_UID: the uid a launcher claimed
  /// for it from the job's "late_uid" counter, so that it can name it in "capacity"'s "leave"),
  /// DRA_JOB_ID (else TORCHELASTIC_RUN_ID),
  /// TORCHELASTIC_RESTART_COUNT. Under torchrun the agent hosts the store (or rank 0 when the
  /// agent does not share it); outside torchrun rank 0 hosts it only with DRA_HOST_STORE=1.
  static launch_info from_env();
  /// Throws std::invalid_argument (naming RANK / WORLD_SIZE) for ids that cannot be right.
  void validate() const;
};

/// What a member released by a shrink does: stand by inside step() until admitted again; exit
/// (step() asks the process to exit 0, giving its device back); or return to the caller, who may
/// use the process for other work and later rejoin() (an RL slot moving between roles).
enum class release_mode { standby, exit, to_caller };
/// "standby", "exit" or "return" (the option's spelling in Python and in events).
const char* to_string(release_mode m) noexcept;
enum class batch_mode { fixed, adascale };

class controller;

/// A phase of a world change, for the test hook; and `reduced`: a step's gradient reduction has
/// just finished on this process (a dra::error the hook throws there fails that reduction on this
/// process alone, after it finished on the others: a time-out on its last receive).
enum class change_phase { rebuild, state_transfer, reshard, reduced };
const char* to_string(change_phase p) noexcept;

/// The test hook called at each phase of every world change. A callable taking the phase's name
/// (`const std::string&`, release 0.1's signature) is still accepted: deprecated, removed in 0.4.
class phase_hook_fn : public std::function<void(change_phase, const controller&)> {
  using base = std::function<void(change_phase, const controller&)>;

 public:
  phase_hook_fn() = default;
  template <class F, std::enable_if_t<std::is_invocable_v<F&, change_phase, const controller&>, int> = 0>
  phase_hook_fn(F f) : base(std::move(f)) {}  // NOLINT(google-explicit-constructor): assigned like a std::function
  template <class F, std::enable_if_t<!std::is_invocable_v<F&, change_phase, const controller&> &&
                                          std::is_invocable_v<F&, const std::string&, const controller&>,
                                      int> = 0>
  [[deprecated("dra 0.2: the phase hook takes a dra::elastic::change_phase (to_string() names it); removed in 0.4")]]
  phase_hook_fn(F f)  // NOLINT(google-explicit-constructor)
      : base([f = std::move(f)](change_phase p, const controller& c) mutable { f(std::string(to_string(p)), c); }) {}
};

/// Everything a controller is configured with. The names are the option names in Python
/// (dra.Controller(**options)); validate() names the option and the fix.
struct controller_options {
  /// Policy, estimator, limits (min/max size, cooldown, ...), throughput model, decide_every.
  engine_config engine;
  int start_size = 0;  ///< processes in the first world; 0: every process launched
  /// What a member released by a shrink does. Unset: exit on a backend whose communicators use a
  /// device (NCCL on a GPU: a standby would keep the device from another job), else standby.
  std::optional<release_mode> release;
  batch_mode batch = batch_mode::fixed;
  std::map<std::int64_t, int>
      resize_schedule;  ///< {committed steps: size}: a resize asked for at a step (kept until reached)
  /// Collective timeout and the survivors' check-in window; a new world's rendezvous gets twice
  /// this (joiners may be slower to arrive than a step).
  double fault_timeout_s = 3.0;
  double store_timeout_s = 30.0;  ///< connecting to the store, and every bounded wait on it
  double chunk_mb = 16.0;         ///< state handoff chunk: memory bound beyond the state
  /// Seconds between the leader's reads of the outside keys (`capacity`, the waiting candidates);
  /// 0: at every step boundary, and a change they ask for is applied at that same boundary (every
  /// member waits for the leader's word there: one store round trip per step), for an outside
  /// actor that moves processes at exact steps, such as the RL coordinator. Otherwise a decision
  /// rides with the next step's gradient reduction and is applied one step later.
  double capacity_poll_s = 1.0;
  bool verify = false;  ///< after every world change, compare a digest of every state tensor
  /// How a grow hands the state to joiners. "full" (false): everything before the joiner's first
  /// step. "deferred" (true): tensors whose digest matches the joiner's own are not sent (a joiner
  /// that already holds the current weights, as an RL slot does), and the provider's deferrable
  /// tensors (the optimizer's) arrive while the joiner computes its first forward and backward,
  /// loaded before its first optimizer step (complete_handoff()).
  bool deferred_handoff = false;
  /// After a fault shrank the world, admit waiting processes again, up to the size the world had
  /// before it (a process left out while stalled or cut off comes back as a standby), whatever
  /// the policy. A process that faults took out twice is not re-admitted this way (a flapping
  /// host); the policy, a schedule or a pool may still admit it. False: only they grow the world.
  bool heal = true;
  std::string events_path;        ///< JSON lines, written by the leader ("" = none)
  std::int64_t status_every = 0;  ///< a status line on rank 0 every N steps (0 = never)
  int max_resize_retries = 3;
  std::string backend = "gloo";  ///< a name registered with comm::register_backend
  std::string backend_address;   ///< address the backend binds to ("" = its default)
  /// Extra configuration every process must agree on (Python adds its own options here).
  std::string config_fingerprint;
  /// Gradient compression in the bucketed reduction (codec_hook.hpp): "" (a plain all-reduce),
  /// "fp32", "fp16", "bf16", "powersgd:<rank>", "topk:<fraction>", "random:<keep fraction>" or
  /// "masked[:<max sparsity>]" (sparse training: RigL masks, configured by `sparsity`).
  /// Every process must give the same (checked at start and admission).
  std::string compress;
  /// How `masked`'s masks move: max sparsity, update interval, swap fraction, end step, and the
  /// target's rule (the convergence phase, or a cubic ramp).
  compress::rigl_config sparsity;
  /// Test hook: called at each phase of every world change (also while the constructor forms the
  /// first world), so tests can kill a process inside a resize, and after each step's reduction
  /// (change_phase::reduced).
  phase_hook_fn phase_hook;
  /// Called about every 100 ms while this process waits for its admission (a candidate in the
  /// constructor, a standby in step(), rejoin()): an exception from it ends the wait, the
  /// registration withdrawn, and leaves the call that waited. The Python binding sets it to
  /// Python's signal check, so Ctrl-C (and a script's own signal handler) acts during a wait.
  std::function<void()> interrupt_check;

  // -- release 0.1's names: deprecated aliases, removed in 0.4 (docs/guide/compatibility.md) -----
  // The controller moves what they hold into the current names (adopt_deprecated_names(), a
  // warning once per name). Their defaults mean "not set". The special members are defined in
  // src/elastic/options.cpp, so that copying options warns nowhere; only naming an alias does.
  controller_options();
  controller_options(const controller_options&);
  controller_options(controller_options&&);
  controller_options& operator=(const controller_options&);
  controller_options& operator=(controller_options&&);
  ~controller_options();
  [[deprecated("dra 0.2: use resize_schedule")]] std::map<std::int64_t, int> schedule;
  [[deprecated("dra 0.2: use engine.decide_every")]] std::int64_t decide_every = 0;
  [[deprecated("dra 0.2: use fault_timeout_s (seconds)")]] std::chrono::milliseconds fault_timeout{0};
  [[deprecated("dra 0.2: use store_timeout_s (seconds)")]] std::chrono::milliseconds store_timeout{0};
  [[deprecated("dra 0.2: use chunk_mb (MiB)")]] std::size_t chunk_bytes = 0;
  [[deprecated("dra 0.2: use backend_address")]] std::string gloo_hostname;

  /// The options a launcher gives a job: the defaults, then DRA_OPTIONS (a JSON object of the
  /// option names; `dra run` and the device pool set it). A C++ trainer starts from these and
  /// sets its own after, so that its own settings win, as a Python script's keywords do. Throws
  /// std::invalid_argument naming DRA_OPTIONS or the option.
  static controller_options from_env();
  /// Moves values set through release 0.1's names (schedule, decide_every, fault_timeout,
  /// store_timeout, chunk_bytes, gloo_hostname, start_size = -1) into the current ones, warning
  /// once per name and process. The controller calls it; call it before validate() when you
  /// validate options by hand.
  void adopt_deprecated_names();
  /// Throws std::invalid_argument naming the option and the fix; checks against the job's size
  /// (min_size, start_size, schedule) happen when the controller knows it.
  void validate() const;
  /// The options for a job of `universe_size` launched processes: checks what needs the job's size
  /// (start_size, min_size, the schedule), sets max_size to the processes launched unless it was
  /// given (raise it for late joiners), lets the goodput policy adapt the batch under adascale.
  /// Returns the first world's size.
  int fit_to_job(int universe_size);
  std::chrono::milliseconds fault_timeout_ms() const;
  std::chrono::milliseconds store_timeout_ms() const;
  std::size_t chunk_size_bytes() const;
};

/// Optional per-step inputs beyond the loss (NaN: not given).
struct step_signals {
  double small_sqr_norm = std::numeric_limits<double>::quiet_NaN();  ///< two-batch gradient statistics
  double small_batch = std::numeric_limits<double>::quiet_NaN();
  double big_sqr_norm = std::numeric_limits<double>::quiet_NaN();
  double big_batch = std::numeric_limits<double>::quiet_NaN();
  double validation = std::numeric_limits<double>::quiet_NaN();  ///< a validation metric (reported; no policy reads it)
  /// Measured step time (throughput model). The first step of each world is not counted: its
  /// time spans the world's forming (a fault's recovery, a handoff, first connections).
  double step_time_s = std::numeric_limits<double>::quiet_NaN();
  double sync_time_s = std::numeric_limits<double>::quiet_NaN();
  /// Throws std::invalid_argument when the gradient statistics are incomplete, their batches not
  /// 0 < small_batch <= big_batch (equal: a world of one, skipped; a NaN/inf norm beside them is
  /// counted as non-finite), or the timings not finite with 0 <= sync_time_s <= step_time_s.
  void validate() const;
};

/// What step() reports: one object per controller, updated in place (valid until the next step).
struct step_status {
  std::int64_t step = -1;  ///< index of the latest committed step (-1 before the first)
  bool committed = false;  ///< this call committed a step (its update applied everywhere)
  double loss = std::numeric_limits<double>::quiet_NaN();  ///< the world's mean loss of the latest step
  int world_size = 0;
  int rank = -1;
  std::int64_t epoch = -1;      ///< world epoch (-1 outside a world)
  bool decided = false;         ///< a decision was taken at this step
  policy::decision decision;    ///< the latest decision
  std::string event;            ///< the JSON line of a world change at this boundary ("" when none)
  bool exit_requested = false;  ///< released with release_mode::exit: the process should exit 0
  bool released = false;        ///< released with release_mode::to_caller: out of the world until rejoin()
  const signals::convergence_signals* signals = nullptr;  ///< the controller's current signals
  /// Energy of the world's processes (members) in the latest step whose figures arrived (one step
  /// late, with the loss) and since the job started (NaN alone or before the first figure), and
  /// its label: "measured" only when every process measured, else "estimated".
  double energy_step_j = std::numeric_limits<double>::quiet_NaN();
  double energy_job_j = std::numeric_limits<double>::quiet_NaN();
  std::string energy_source;
};
/// Release 0.1's name of step_status (deprecated, removed in 0.4).
using step_result [[deprecated("dra 0.2: use step_status")]] = step_status;

/// Bytes of the bucketed reductions a hook (gradient codec) reduced, per rank.
struct compression_stats {
  std::string codec;  ///< the hook's spec ("" without one; "custom" for a hook set by hand)
  hook_bytes bytes;   ///< payload handed to the communicator and what fp32 would have handed
  double ratio() const {
    return bytes.sent > 0 ? static_cast<double>(bytes.dense) / static_cast<double>(bytes.sent) : 1.0;
  }
};

/// This process's own energy (a per-process reader: NVML for its CUDA device, else the CPU model).
struct process_energy {
  double step_j = 0.0;  ///< the latest committed step
  double job_j = 0.0;   ///< since it first entered a world (time out of the world not counted)
  std::string source;   ///< "measured" or "estimated"
  std::string reader;   ///< "nvml", "cpu-model"
  std::string scope;
};

/// What the trainer knows of the batch it is about to reduce, for the job's exactly-once check
/// (Python's sampler iterator knows it; a trainer that takes sampler.indices() each step never
/// skips a batch: a failed step hands it the same indices again).
struct batch_check {
  /// Batches handed to the training loop and not yet stepped, this one included (-1: unknown).
  /// Every rank of a world holds as many; one that holds more skipped a batch.
  int in_flight = -1;
  /// Batches this rank was handed and skipped since its previous reduced batch (a caught
  /// exception, a `continue`).
  int skipped = 0;
  /// Loader batches whose gradients this reduction carries (gradient accumulation: the batches
  /// trained under `no_sync()` since the previous reduction, and this one). Its commit consumes
  /// as many consecutive steps of the sampler; every rank of the world must carry as many.
  int micro = 1;
  /// DDP's find_unused_parameters: a parameter no rank had a gradient for keeps none (None), as
  /// in one process, instead of a zero gradient. Every rank of the world passes the same value.
  bool unused_to_none = false;
};

/// A step the world refused because a rank did not train its batch: nothing was applied or
/// committed, and the step is redone with the same samples.
struct step_refusal {
  std::int64_t step = 0;
  std::string reason;  ///< names the ranks that skipped when the world can tell
  int excess = 0;      ///< batches this rank holds beyond the world's (the ones it skipped)
};

/// How often the host read values the device produced (the loss, what rides with the reductions)
/// and how often such a read had to wait for the device: what "no synchronisation per step" means.
struct device_read_stats {
  std::uint64_t reads = 0;           ///< reads of device values (decision steps only)
  std::uint64_t blocking_waits = 0;  ///< of which the device had not finished when read
};

namespace detail {
class store_protocol;
class gradient_reducer;
class deferred_reads;
struct tail_input;
class event_log;
class deferred_transfer;
class leader;
struct world_change;
struct published_decision;
struct admission_result;
struct job_figures;
}  // namespace detail

class controller {
 public:
  /// A process alone: signals and decisions, no world, no store.
  explicit controller(controller_options options);
  /// A process of an elastic job: connects to the store, checks that every process has the same
  /// configuration and model, then forms the first world (uids < start_size) or waits as a
  /// candidate until admitted (or the job ends); with release_mode::to_caller a process outside
  /// the first world returns at once, released (it enters with rejoin() or try_join()). Throws std::invalid_argument
  /// for bad options, dra::timeout_error naming the address when the store cannot be reached, dra::state_mismatch_error
  /// for a different model.
  controller(controller_options options, launch_info launch, std::shared_ptr<state_provider> state,
             std::shared_ptr<elastic_sampler> sampler);
  ~controller();
  controller(const controller&) = delete;
  controller& operator=(const controller&) = delete;

  /// After backward: averages the gradients over the step's global batch (each rank's gradient
  /// weighted by its share of the samples; a parameter without a gradient counts as zero) in one
  /// all-reduce that also carries the previous step's loss and the leader's decision flag.
  /// Returns false when the reduction failed (a peer died or hung): the trainer must not apply
  /// this step; step() then recovers and the step is redone.
  bool reduce_gradients(const std::vector<at::Tensor>& params);
  /// The same, bucketed and overlapped with backward: begin_reduction at the first gradient of a
  /// step (false: nothing to reduce on this rank now, e.g. a failed step); gradient_ready(i) when
  /// params[i]'s gradient is accumulated (buckets are all-reduced as they fill, on CUDA on a stream
  /// of their own); finish_reduction at the end of backward (false: the step failed).
  bool begin_reduction(const std::vector<at::Tensor>& params, const batch_check& check = {});
  void gradient_ready(std::size_t index);
  bool finish_reduction();
  /// The module's buffers (BatchNorm's running statistics and counts) to average over the world
  /// at every committed step, before any decision (DDP's broadcast_buffers makes them equal too):
  /// each becomes the world's mean on every rank, integer buffers rounded. A failed all-reduce
  /// leaves them as they were and fails the step that follows (it recovers). Empty: not averaged
  /// (they still travel with the state at world changes).
  void set_buffers(std::vector<at::Tensor> buffers) { buffers_ = std::move(buffers); }
  /// Transforms gradient buckets around their all-reduce (the hook point for gradient codecs);
  /// null: plain all-reduce. Every process of the world must install the same hook, before its
  /// first step (the `compress` option installs a codec_hook in the constructor). The hook's
  /// shared_state() travels with the training state on world changes.
  void set_bucket_hook(std::shared_ptr<bucket_hook> hook);
  bucket_hook* installed_bucket_hook() const noexcept { return hook_.get(); }
  /// Bytes the hook reduced (per rank, since the process started).
  compression_stats compression() const;
  /// The deferred part of this process's latest handoff (deferred_handoff) is complete: a joiner
  /// waits for the optimizer's tensors and loads the state; the sender waits until they left (its
  /// own optimizer step must not change them in flight). Called by the optimizer wrapper before
  /// each optimizer step (a LibTorch trainer calls it before optimizer.step()), and by step() and
  /// every world change. A transfer that failed marks the step failed (step() then recovers).
  void complete_handoff();
  /// This process's latest handoff: bytes received or sent, bytes skipped (identical digests),
  /// bytes deferred, the deferred transfer's duration and how long complete_handoff() waited.
  struct handoff_stats {
    bool deferred = false;
    std::uint64_t bytes = 0, skipped_bytes = 0, deferred_bytes = 0;
    double deferred_s = 0.0, wait_s = 0.0;
  };
  const handoff_stats& last_handoff() const noexcept { return handoff_stats_; }
  /// This process's energy (an elastic job's member; the world's is in status()).
  process_energy energy() const;
  /// The step boundary: commits the step, feeds the engine, applies a decision (resize) or
  /// recovers from a failure. `loss` is this rank's mean loss over its share of the step. A
  /// released process waits here (standby) until admitted again. In an elastic job, throws
  /// std::logic_error when no gradient reduction ran since the last step (the model was not
  /// wrapped).
  const step_status& step(double loss, const step_signals& extra = {});
  /// The same with the loss as a 0-d tensor. A CUDA loss is never read on the host at a step
  /// without a decision: it rides with the next reduction on the device (in a world) or waits in a
  /// ring on the device (alone), and is read, one step late, where a decision needs it; status().loss
  /// is then the latest value read. A CPU tensor is read at once.
  const step_status& step(const at::Tensor& loss, const step_signals& extra = {});
  /// A step whose batch was stale (a data loader prefetched it for a world that has changed since):
  /// this process trained on it locally but must not reduce or commit it. Clears the step's status.
  const step_status& skip_step() noexcept;
  /// Restarting a whole job from a checkpoint: the committed steps it had (every process passes the
  /// same value, before the first step). Throws std::logic_error after a step was taken.
  void resume_at(std::int64_t step_index);
  /// Training loop helper: true while this process is a member and `num_epochs` are not done;
  /// moves the sampler to the next epoch when the current one is exhausted. When it returns
  /// false the job is finished for this process (finish() was called).
  bool next_epoch(std::int64_t num_epochs);
  /// A process released with release_mode::to_caller asks to be admitted again and waits until it
  /// is (true), or the job ends (false). Throws dra::state_mismatch_error when refused.
  bool rejoin();
  /// The same without waiting: registers as a candidate on the first call, and returns true once
  /// admitted (the world is then entered, which blocks for the rendezvous), false while waiting
  /// or when the job has ended (current_role() tells which).
  bool try_join();
  /// End of training: members meet once more; the leader tells the standby processes to go. A
  /// store or peer already gone at this point changes nothing (training is over): never throws.
  void finish() noexcept;
  /// Asks the job to stop cleanly (what a SIGTERM to a worker of `dra run` does): the request
  /// rides with this process's next gradient reduction, every member learns of it from the same
  /// reduction and ends training at the same step boundary (the step in hand is finished and
  /// committed, then finish()); the code after the training loop runs, so the leader can write
  /// the final checkpoint. Async-signal-safe (sets a flag). Alone (no world) it only sets
  /// stop_requested(). A standby ends with the job.
  void request_stop() noexcept { stop_requested_.store(true, std::memory_order_relaxed); }
  bool stop_requested() const noexcept { return stop_requested_.load(std::memory_order_relaxed); }
  /// Training ended because a member asked to stop (request_stop()).
  bool stopped() const noexcept { return stopped_; }
  /// This process leaves the job now, in the middle of training (an uncaught exception is on its
  /// way out of the trainer): the communicator is closed, so the peers' step fails at once, and the
  /// process is marked gone on the store with its heartbeat stopped, so their recovery does not
  /// wait for it. Never throws; the process is finished afterwards (finish() does nothing).
  void abandon(const std::string& why) noexcept;
  /// The trainer's previous reduction never reached step() (it skipped the update after backward,
  /// or caught an exception there, and went on): the world committed that step, so this process
  /// commits it too. On a synchronous backend the miss rides with the next reduction, where the
  /// world compares state digests: a differing state is taken again (a recovery), identical ones
  /// go on. On an asynchronous one the process takes the world's state again at its next step.
  /// begin_reduction() does this itself, but then the batch in hand was taken before the missed
  /// step was committed (the missed step's, from the sampler): that step is refused and redone.
  /// Called before taking the next batch (Python's model wrapper does), it avoids the redo.
  /// Returns whether a step was missed.
  bool catch_up_missed_step() noexcept;
  /// This rank committed the previous step but did not apply its update (its optimizer did not
  /// step: a skip decided on its own loss, or on every rank alike on a non-finite norm). On a
  /// synchronous backend it rides with the next reduction as a missed step does: identical states
  /// go on, a differing one is taken again (a recovery). Nothing on an asynchronous one.
  void note_update_skipped() noexcept;
  /// The trainer accumulates gradients across steps without no_sync() and this step's optimizer
  /// update is still to come (the window is open): a decision read now waits for a step that closes
  /// a window, up to kWindowHoldSteps steps (a joiner's loop counts its window from its own first
  /// batch: admitted inside a window, it stepped its optimizer out of phase for good).
  void set_window_open(bool open) noexcept { window_open_ = open; }
  static constexpr int kWindowHoldSteps = 64;
  /// The latest step() refused the step (a rank did not train its batch), or nothing.
  const std::optional<step_refusal>& refusal() const noexcept { return refusal_; }

  role current_role() const noexcept { return role_; }
  bool is_local() const noexcept { return role_ == role::local; }
  bool is_member() const noexcept { return role_ == role::member || role_ == role::local; }
  /// The current step's reduction failed (it is redone after a recovery) or the world refused it
  /// (it is redone): its update must not be applied.
  bool failed() const noexcept { return !failure_.empty() || refused_.has_value(); }
  int uid() const noexcept { return uid_; }
  /// The rank in the world now (-1 outside it). After the job finished, the rank this process had
  /// in the last world (-1 if it was not a member then), so that "save on rank 0" after the
  /// training loop works.
  int rank() const noexcept;
  /// rank() == 0: the world's leader now, or after the end the leader of the last world.
  bool is_leader() const noexcept { return rank() == 0; }
  int world_size() const noexcept;
  std::int64_t epoch() const noexcept { return epoch_; }
  std::int64_t step_index() const noexcept { return step_index_; }
  std::int64_t resizes() const noexcept { return resizes_; }
  int universe_size() const noexcept { return universe_size_; }
  int start_size() const noexcept { return start_size_; }
  const std::vector<int>& members() const noexcept { return members_; }
  std::optional<std::uint64_t> last_digest() const noexcept { return last_digest_; }
  const step_status& status() const noexcept { return status_; }
  /// Consecutive non-finite losses passed to step() (1: a streak starts; callers warn once).
  std::uint64_t nonfinite_streak() const noexcept { return input_nonfinite_streak_; }
  /// A streak of non-finite losses started during the latest step() (device losses are seen when
  /// read), and the value that started it.
  bool nonfinite_started() const noexcept { return nonfinite_started_; }
  /// Reads of device values so far and how many had to wait for the device.
  device_read_stats device_reads() const noexcept;
  const controller_options& options() const noexcept { return options_; }
  /// The JSON line of the latest event this process emitted ("" when none).
  const std::string& last_event() const noexcept;
  /// Every event this process emitted (JSON lines), oldest first.
  const std::vector<std::string>& events() const noexcept;
  /// Candidates registered on the store (standby and late joiners), read now.
  std::vector<int> registered_candidates();
  std::string store_address() const;
  resize_engine& engine() noexcept { return engine_; }
  elastic_sampler* sampler() noexcept { return sampler_.get(); }
  comm::communicator* communicator() noexcept { return comm_.get(); }
  /// Digest (62 bits) of the state tensors the provider hands over: equal on every rank after a
  /// world change (checked when options.verify).
  std::uint64_t state_digest();

 private:
  void wait_for_admission();
  bool admitted(const struct detail::admission_result& r);
  void enter_world(const detail::world_change& change);
  void hand_over_state(const detail::world_change& change, std::uint64_t& nbytes, std::uint64_t& skipped_bytes);
  const step_status& step_impl(const at::Tensor* device_loss, double loss, const step_signals& extra);
  const step_status& step_local(const at::Tensor* device_loss, double loss);
  void commit(const at::Tensor* device_loss, double loss, const step_signals& extra);
  void average_buffers();
  void read_reductions(std::int64_t committed);
  bool decision_point(std::int64_t committed) const;
  bool read_due(std::int64_t committed) const;
  void note_loss(double loss);
  void say_if_loss_never_positive();
  void say_if_loss_turned_nonpositive(const dra::signals::convergence_signals& signals);
  void note_world_energy(double joules, bool estimated);
  detail::job_figures figures() const;
  void start_energy_meter();
  void apply_signals(const step_signals& extra);
  void leader_decides();
  void apply_decision();
  void decide_at_boundary();
  void leave(bool exit);
  void stop_at_boundary() noexcept;
  void recover(std::string reason);
  /// In a recovery: throws when a member of the failed world ended its training loop (finish):
  /// this process went on training where the others stopped.
  void refuse_to_train_past_the_loops_end(const std::string& reason);
  /// After recover(): the step `attempted` failed here but the handed-over state is one step on.
  void note_step_taken_over(std::int64_t attempted, const std::string& reason);
  void hook(change_phase phase);
  bool check_batches(const at::Tensor& tail);
  bool settle_missed_step(double missed);
  bool hold_for_window();  ///< whether a decision waits for an open accumulation window to close
  void refuse_step();
  bool follows(std::int64_t parent, std::int64_t child);

  controller_options options_;
  resize_engine engine_;
  std::shared_ptr<state_provider> state_;
  std::shared_ptr<elastic_sampler> sampler_;
  std::unique_ptr<detail::store_protocol> store_;
  std::shared_ptr<comm::backend> backend_;
  std::unique_ptr<comm::tensor_transfer> transfer_;
  std::unique_ptr<comm::communicator> comm_;
  std::unique_ptr<detail::gradient_reducer> reducer_;
  std::shared_ptr<bucket_hook> hook_;
  std::unique_ptr<dra::energy::energy_meter> meter_;  ///< this process's energy (members only)
  double world_energy_j_ = 0.0;                       ///< the world's energy since the job started
  bool world_energy_known_ = false;
  bool world_energy_measured_ = true;
  std::unique_ptr<detail::event_log> log_;
  std::unique_ptr<detail::deferred_transfer> deferred_;  ///< the handoff's part still in flight
  handoff_stats handoff_stats_;
  std::unique_ptr<detail::leader> leader_;
  std::unique_ptr<detail::published_decision> pending_;  ///< the leader's decision, not yet applied
  std::unique_ptr<detail::tail_input> pending_loss_;     ///< this rank's loss, sent with the next reduction
  std::unique_ptr<detail::deferred_reads> reads_;        ///< what rode with the reductions (alone: device losses)
  at::Tensor solo_tail_;                                 ///< a world of one: its own tail, on the device
  bool local_take_due_ = false;                          ///< alone: device losses prefetched, fed at the next step

  int uid_ = 0;
  int universe_size_ = 1;
  int start_size_ = 1;
  bool joined_late_ = false;
  role role_ = role::local;
  bool holds_state_ = false;          ///< holds the world's training state (a joiner: once received)
  bool registered_ = false;           ///< registered as a candidate (release_mode::to_caller, try_join)
  std::vector<int> members_;          ///< the world being entered or running
  std::vector<int> running_members_;  ///< the world that last completed its entry
  /// The size the world had before faults shrank it (options.heal): set by every other change.
  int heal_size_ = 0;
  std::map<int, int> fault_leaves_;  ///< per process: how many faults took it out of the world
  std::string last_dismissal_;       ///< the reason of the latest dismissal printed (said once)
  std::int64_t epoch_ = -1;
  std::int64_t timed_epoch_ = -1;  ///< the world epoch of the last committed step (apply_signals)
  std::int64_t step_index_ = 0;
  std::int64_t resizes_ = 0;
  std::int64_t num_epochs_ = -1;
  std::int64_t samples_ = 0;  ///< samples committed by the world since this process joined
  std::string failure_;
  bool reduced_ = false;
  bool decision_flag_ = false;
  bool window_open_ = false;  ///< set_window_open: an accumulation window is open at this step()
  int window_held_ = 0;       ///< steps a decision has waited for a window to close
  bool exit_requested_ = false;
  std::atomic<bool> stop_requested_{false};  ///< request_stop(): may be set from a signal handler
  bool stop_seen_ = false;                   ///< a member's stop request rode with a reduction read now
  bool stopped_ = false;
  int final_rank_ = -1;  ///< the rank in the last world, kept by finish()
  int final_size_ = 0;
  bool device_released_ = false;  ///< the state provider gave the device's memory back (standby)
  double decide_s_ = 0.0;
  double world_loss_ = std::numeric_limits<double>::quiet_NaN();
  bool world_loss_known_ = false;
  std::uint64_t input_nonfinite_streak_ = 0;
  bool nonfinite_started_ = false;
  std::optional<std::uint64_t> last_digest_;
  std::vector<tensor_spec> signature_;
  state_layout layout_;                  ///< the rest of the state a handoff sends (compared at start and admission)
  batch_check batch_;                    ///< the batch being reduced (begin_reduction)
  std::vector<at::Tensor> buffers_;      ///< averaged at every committed step (set_buffers)
  std::optional<std::int64_t> missed_;   ///< the step whose reduction this rank did not follow by step()
  bool missed_said_ = false;             ///< the all-identical outcome of a missed step was reported
  bool nonpositive_said_ = false;        ///< a loss never positive was reported
  bool nonpositive_run_said_ = false;    ///< a loss that turned <= 0 after positive ones was reported
  std::uint64_t nonpositive_run_ = 0;    ///< consecutive losses <= 0 fed to the engine (as the leader saw)
  std::uint64_t nonpositive_seen_ = 0;   ///< the estimator's nonpositive_count at the previous look
  std::uint64_t accepted_seen_ = 0;      ///< its accepted count at the previous look
  std::optional<step_refusal> refused_;  ///< this step is refused (set at its reduction)
  std::optional<step_refusal> refusal_;  ///< the latest step() was a refusal
  int refusals_in_a_row_ = 0;
  step_status status_;
};

}  // namespace dra::elastic
