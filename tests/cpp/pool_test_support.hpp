// What the pool's tests share: a pool of CPU slots, and a plan carried out on a lease book as the
// daemon would (grants taken, releases asked for).
#pragma once

#include <string>

#include "dra/pool/inventory.hpp"
#include "dra/pool/lease.hpp"
#include "dra/pool/scheduler.hpp"

namespace pool_test {

/// n CPU slots of 2 GB, cgroup-enforced, named slot0..slot{n-1}.
inline dra::pool::inventory slots(int n) {
  dra::pool::inventory inv;
  for (int s = 0; s < n; ++s) {
    dra::pool::device d;
    d.id = "slot" + std::to_string(s);
    d.type = "cpu-slot";
    d.memory_gb = 2;
    d.enforcement = "cgroup";
    inv.add(d);
  }
  return inv;
}

/// Grants the plan's grants and marks its releases as releasing.
inline void apply(const dra::pool::inventory& inv, dra::pool::lease_book& book, const dra::pool::plan& p, double now) {
  for (const auto& g : p.grants) book.grant(inv, g.job, g.device, g.share, now);
  for (const auto& r : p.releases) book.mark_releasing(r.lease);
}

}  // namespace pool_test
