#pragma once
// What a leader knows of its RL pipeline at a boundary of the trainers' world: the input of the
// look-ahead planner (events.hpp, plan_lookahead). The live leader (python/dra/rl/live/pipeline.py)
// builds one from its workers' reports; the event simulator builds one from its own state and
// plans through the same call, so the planner the simulator evaluates is the one the live leader
// runs. It holds only what a leader can know: roles, the weights each slot holds, the sequences in
// flight and what each generated so far, the queues, the finished sequences' lengths, the
// training step's progress, the last switch's measured parts and the engines' configured limits.
// docs/design/rl.md ("The look-ahead planner").
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dra/error.hpp"

namespace dra::sim {

/// A sequence's id is batch * sequences_per_step + i, with i = prompt * group_size + sample (the
/// samples of one prompt are consecutive: a GRPO group).
struct pipeline_sequence {
  int id = 0;
  double generated = 0.0;    ///< tokens generated so far
  double admitted_at = 0.0;  ///< tokens it had generated when this slot admitted it (> 0: resumed after a preemption)
};

struct pipeline_slot {
  /// "rollout" (generating or idle), "train" (a member of the trainers' world) or "starting" (left
  /// the trainers, its inference engine not up yet).
  std::string role = "rollout";
  /// The policy version of the weights it holds (-1: unpublished weights, left between updates).
  int version = 0;
  /// When its in-flight progress was reported (the time it decodes on from); starting: when its
  /// engine is up.
  double clock_s = 0.0;
  /// Sequences decoding on it, in the engine's order.
  std::vector<pipeline_sequence> in_flight;
  /// Sequences it preempted (KV cache full), (id, tokens generated so far), re-admitted first.
  std::vector<std::pair<int, double>> waiting;
};

/// A batch at or after the step the trainers train next.
struct pipeline_batch {
  bool open = false;  ///< its weights are published: its sequences are queued or generating
  double opened_s = 0.0;
  double complete_s = -1.0;  ///< when its last sequence finished (-1: not yet)
  int rollout_at_open = 0;   ///< rollout slots when it opened
  int remaining = 0;         ///< sequences not finished
  /// Sequences not started, per slot (the slot's share; an idle slot steals from the longest).
  std::vector<std::vector<int>> queued;
};

/// The parts of the last switches, as measured (negative: none measured yet; the policy's prior).
struct measured_switch {
  double agree_s = -1.0, rebuild_s = -1.0;      ///< the last switch of either direction
  double weights_s = -1.0, optimizer_s = -1.0;  ///< the last join
};

struct pipeline_snapshot {
  double now_s = 0.0;
  std::uint64_t seed = 0;  ///< the look-ahead's draws: seeded by this and now_s
  // The run's shape.
  int steps = 1;
  int prompts_per_step = 1;
  int group_size = 1;
  int updates_per_step = 1;
  double prompt_tokens = 0.0;
  double max_generation_tokens = 1.0;
  // The inference engines' configured limits.
  int max_concurrency = 128;
  double kv_capacity_tokens = 0.0;  ///< 0: no KV limit
  double kv_watermark = 0.05;
  double kv_reserve_ratio = 0.0;
  /// Windows the look-ahead runs ahead (the oracle's oracle_lookahead).
  int horizon_windows = 2;
  // Training.
  int step = 0;           ///< the step the trainers train next (or are training)
  int update = 0;         ///< training: the update about to start (the boundary before it)
  bool training = false;  ///< false: the step's window (the trainers wait for its batch)
  int published = 0;      ///< policy versions published (steps trained)
  double trainers_free_s = 0.0;
  std::vector<int> members;  ///< the trainers' slots, the leader first
  std::vector<pipeline_slot> slots;
  /// Batches step, step + 1, ... (those after the last given are not open).
  std::vector<pipeline_batch> batches;
  /// Per batch, per sequence: its length once finished (> 0), else 0. Every sequence of a batch
  /// before `step` is finished.
  std::vector<std::vector<double>> lengths;
  measured_switch last_switch;

  int sequences_per_step() const { return prompts_per_step * group_size; }

  /// Checks the shape and the ids; names the field and the fix.
  void validate() const {
    const auto bad = [](const char* field, const std::string& why) { dra::detail::throw_invalid(field, why); };
    if (steps < 1 || prompts_per_step < 1 || group_size < 1 || updates_per_step < 1)
      bad("steps", "steps, prompts_per_step, group_size and updates_per_step must all be >= 1");
    if (slots.size() < 2) bad("slots", "a pipeline has >= 2 slots (one per role), got " + std::to_string(slots.size()));
    if (step < 0 || step >= steps)
      bad("step", "must lie in [0, steps - 1] = [0, " + std::to_string(steps - 1) + "], got " + std::to_string(step));
    if (update < 0 || update >= updates_per_step)
      bad("update", "must lie in [0, updates_per_step - 1], got " + std::to_string(update));
    if (training && update == 0) bad("update", "training: the boundary before update >= 1 (update 0 is the window)");
    if (lengths.size() != static_cast<std::size_t>(steps))
      bad("lengths",
          "one list per batch: " + std::to_string(steps) + " expected, got " + std::to_string(lengths.size()));
    const auto n = static_cast<std::size_t>(sequences_per_step());
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      if (lengths[b].size() != n)
        bad("lengths", "batch " + std::to_string(b) + " has " + std::to_string(lengths[b].size()) +
                           " entries; one per sequence (" + std::to_string(n) + ") expected");
      for (double v : lengths[b])
        if (!(v >= 0.0) || (b < static_cast<std::size_t>(step) && !(v > 0.0)))
          bad("lengths", "batch " + std::to_string(b) +
                             ": a length is a finite number > 0 (0: not finished; every "
                             "sequence of a trained batch is finished)");
    }
    const int total = steps * sequences_per_step();
    int trainers = 0;
    for (std::size_t d = 0; d < slots.size(); ++d) {
      const auto& sl = slots[d];
      if (sl.role != "rollout" && sl.role != "train" && sl.role != "starting")
        bad("slots",
            "slot " + std::to_string(d) + ": role must be 'rollout', 'train' or 'starting', got '" + sl.role + "'");
      trainers += sl.role == "train";
      const auto check = [&](int id, double generated, double admitted_at) {
        if (id < 0 || id >= total || !(generated >= 0.0) || !(admitted_at >= 0.0 && admitted_at <= generated))
          bad("slots", "slot " + std::to_string(d) + ": sequence " + std::to_string(id) +
                           " (ids lie in [0, steps x sequences_per_step); 0 <= admitted_at <= generated)");
      };
      for (const auto& q : sl.in_flight) check(q.id, q.generated, q.admitted_at);
      for (const auto& [id, generated] : sl.waiting) check(id, generated, 0.0);
    }
    if (trainers != static_cast<int>(members.size()) || members.empty())
      bad("members", "the trainers' slots: " + std::to_string(trainers) + " slots have role 'train' but " +
                         std::to_string(members.size()) + " members are listed (>= 1 needed)");
    for (int m : members)
      if (m < 0 || m >= static_cast<int>(slots.size()) || slots[static_cast<std::size_t>(m)].role != "train")
        bad("members", "slot " + std::to_string(m) + " is listed as a trainer but is not one");
    if (batches.size() > static_cast<std::size_t>(steps - step))
      bad("batches", "at most steps - step batches, got " + std::to_string(batches.size()));
    for (std::size_t i = 0; i < batches.size(); ++i) {
      const auto& bt = batches[i];
      if (!bt.open) continue;
      if (bt.queued.size() != slots.size())
        bad("batches", "an open batch lists its queue per slot: " + std::to_string(slots.size()) + " lists expected");
      for (const auto& q : bt.queued)
        for (int id : q)
          if (id / sequences_per_step() != step + static_cast<int>(i))
            bad("batches", "sequence " + std::to_string(id) + " is queued in batch " +
                               std::to_string(step + static_cast<int>(i)) + " but belongs to another");
      if (bt.remaining < 0 || bt.remaining > sequences_per_step())
        bad("batches", "remaining must lie in [0, sequences_per_step], got " + std::to_string(bt.remaining));
    }
  }
};

/// The look-ahead planner's answer: the trainer count to move to, and which slots move.
struct planner_move {
  int trainers = 0;
  std::vector<int> leave;  ///< trainers that go to rollout (the newest members)
  std::vector<int> join;   ///< idle rollout slots that join the trainers
  std::string reason;
};

}  // namespace dra::sim
