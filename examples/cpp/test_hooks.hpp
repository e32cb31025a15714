// Test hooks of examples/cpp/elastic_train.cpp: what lets the tests and the fault campaign
// (python -m dra.bench faults) check a run from outside. Nothing here is needed to train.
//
//   record_log   --log-samples DIR: one JSON object a line in DIR/samples-<uid>.jsonl, flushed at
//                once: "attempt" (this rank's share of a step, written before the step's gradient
//                reduction), "commit", "world" (after each world change entered), "fault" (an
//                in-process fault about to happen), "final". The same records as the Python worker
//                of the campaign (benchmarks/dra_bench/_faults/worker.py).
//   fault_spec   --test-fault ACTION:WHERE:INDEX[:SECONDS],...: this process kills itself (kill),
//                stalls (sleep SECONDS), throws an exception nobody catches (raise) or one the
//                training loop catches and skips the rest of the step for (catch; step,
//                after_reduce and after_update only) in a phase of its INDEX-th world change
//                (rebuild, state_transfer, reshard; 0 is its first: the start or its admission), at
//                the start of step INDEX (step), or at step INDEX between the gradient reduction and
//                the optimizer step (after_reduce) or between the optimizer step and the step
//                boundary (after_update). The grammar of benchmarks/dra_bench/_faults/spec.py.
#pragma once

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace example {

inline double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

inline double rss_mb() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / 1048576.0;
}

template <class T>
std::string json_list(const std::vector<T>& v) {
  std::ostringstream s;
  s << "[";
  for (std::size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  s << "]";
  return s.str();
}

/// The records of one process (opened at the first write, when the uid is known).
class record_log {
 public:
  explicit record_log(std::string dir) : dir_(std::move(dir)) {}
  bool enabled() const { return !dir_.empty(); }
  /// `fields`: the record's JSON members after uid, pid and time, e.g. "\"kind\": \"commit\", ...".
  void write(int uid, const std::string& fields) {
    if (!enabled()) return;
    if (!out_.is_open()) {
      const std::string path = dir_ + "/samples-" + std::to_string(uid) + ".jsonl";
      out_.open(path, std::ios::app);
      if (!out_) throw std::runtime_error("--log-samples: cannot append to '" + path + "'");
    }
    char head[128];
    std::snprintf(head, sizeof head, "{\"uid\": %d, \"pid\": %d, \"time\": %.6f, ", uid, static_cast<int>(::getpid()),
                  wall_time());
    out_ << head << fields << "}" << std::endl;  // flushed: a killed process keeps what it wrote
  }

 private:
  std::string dir_;
  std::ofstream out_;
};

struct fault_spec {
  std::string action;  // kill | sleep | raise | catch
  std::string where;   // rebuild | state_transfer | reshard | step | after_reduce
  std::int64_t index = 0;
  double seconds = 0.0;
  bool fired = false;
};

inline std::vector<fault_spec> parse_fault_specs(const std::string& text) {
  std::vector<fault_spec> out;
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    std::vector<std::string> parts;
    std::stringstream ps(item);
    std::string p;
    while (std::getline(ps, p, ':')) parts.push_back(p);
    const auto bad = [&] {
      return std::invalid_argument(
          "--test-fault: expected ACTION:WHERE:INDEX[:SECONDS] (kill|sleep|raise|catch, rebuild|"
          "state_transfer|reshard|step|after_reduce|after_update), got '" +
          item + "'");
    };
    if (parts.size() < 3 || parts.size() > 4) throw bad();
    fault_spec f;
    f.action = parts[0];
    f.where = parts[1];
    if ((f.action != "kill" && f.action != "sleep" && f.action != "raise" && f.action != "catch") ||
        (f.where != "rebuild" && f.where != "state_transfer" && f.where != "reshard" && f.where != "step" &&
         f.where != "after_reduce" && f.where != "after_update"))
      throw bad();
    try {
      f.index = std::stoll(parts[2]);
      if (parts.size() == 4) f.seconds = std::stod(parts[3]);
    } catch (const std::exception&) {
      throw bad();
    }
    if (f.action == "sleep" && !(f.seconds > 0)) throw bad();
    out.push_back(f);
  }
  return out;
}

/// The in-process faults of this process: fire() acts on the first unfired spec matching `where`
/// and `index`, after writing its "fault" record. True: the training loop skips the rest of the
/// step (an exception it caught).
class fault_plan {
 public:
  fault_plan(std::vector<fault_spec> specs, record_log& log) : specs_(std::move(specs)), log_(log) {}
  bool empty() const { return specs_.empty(); }
  bool fire(const std::string& where, std::int64_t index, int uid, std::int64_t step, std::int64_t epoch) {
    bool skip = false;
    for (auto& f : specs_) {
      if (f.fired || f.where != where || f.index != index) continue;
      f.fired = true;
      log_.write(uid, "\"kind\": \"fault\", \"action\": \"" + f.action + "\", \"where\": \"" + where +
                          "\", \"step\": " + std::to_string(step) + ", \"epoch\": " + std::to_string(epoch));
      std::printf("[dra-cpp] uid %d: test hook: %s in %s at step %lld\n", uid, f.action.c_str(), where.c_str(),
                  static_cast<long long>(step));
      std::fflush(stdout);
      if (f.action == "kill") std::raise(SIGKILL);
      if (f.action == "raise") throw std::runtime_error("test hook: an exception nobody catches in " + where);
      if (f.action == "catch") {
        try {
          throw std::runtime_error("test hook: an exception the training loop catches");
        } catch (const std::runtime_error&) {
          skip = true;  // the loop goes on with its next batch
        }
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(f.seconds));
    }
    return skip;
  }

 private:
  std::vector<fault_spec> specs_;
  record_log& log_;
};

}  // namespace example
