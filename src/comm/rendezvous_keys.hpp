// The store keys a backend wrote to build a world, erased two worlds later. Each world's
// rendezvous leaves keys in the job's store (Gloo's address of every member, NCCL's unique ids
// and votes); a job that changes its world every few seconds piled them up for its whole life
// (an outside long-run review: 7,500 keys, about 1.3 MB, after 3,000 changes of 3 processes).
//
// When this process has built world E, it erases the keys it is responsible for in the world it
// built before E-1's: by then every member of E has built E (and so left E-1's rendezvous behind),
// and a member of an older world that still waits on one of its keys was dropped from the job two
// changes ago. The last two worlds' keys stay (a rendezvous that is still finishing reads them).
// Erasure is best effort: a store that no longer answers (the job is ending) leaves them.
#pragma once

#include <deque>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

namespace dra::comm::detail {

class rendezvous_keys {
 public:
  /// This process built a world whose rendezvous wrote `keys` to `store` (names that were never
  /// written are fine: erasing one is a no-op). Erases the keys of every world noted before the
  /// previous one.
  void built(std::vector<std::string> keys, c10::intrusive_ptr<c10d::Store> store) noexcept {
    while (kept_.size() >= 2) {
      erase(kept_.front());
      kept_.pop_front();
    }
    try {
      kept_.push_back({std::move(keys), std::move(store)});
    } catch (...) {
      // Out of memory while noting a few strings: the keys stay on the store, nothing else changes.
    }
  }

 private:
  struct world {
    std::vector<std::string> keys;
    c10::intrusive_ptr<c10d::Store> store;
  };

  static void erase(const world& w) noexcept {
    if (!w.store) return;
    try {
      for (const auto& k : w.keys) w.store->deleteKey(k);
    } catch (...) {
      // The store is gone or does not answer: the job is ending, and its keys go with the store.
    }
  }

  std::deque<world> kept_;
};

}  // namespace dra::comm::detail
