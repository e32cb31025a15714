#!/usr/bin/env bash
# Runs a command on a host whose DNS resolver never answers (root; iproute2): a network namespace
# with loopback, and every other address routed to a neighbour that drops all. This is the
# condition in which c10d's reverse lookup of a peer stalls each process's first connection
# (docs/guide/elastic.md, "What is survived"); a CI host that resolves only its package registries
# behaves so. Set up first (./scripts/setup.sh needs the registries), then for example:
#   ./scripts/stalled_resolver.sh ./scripts/test.sh
set -euo pipefail
[ "$#" -gt 0 ] || { echo "usage: $0 COMMAND [ARG...]" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "$0: needs root (unshare -n, ip link)" >&2; exit 2; }
exec unshare -n sh -c 'ip link set lo up && ip link add v0 type veth peer name v1 &&
  ip addr add 10.0.0.1/24 dev v0 && ip link set v0 up && ip link set v1 up &&
  ip neigh add 10.0.0.2 lladdr 02:00:00:00:00:02 dev v0 && ip route add default via 10.0.0.2 dev v0 &&
  exec "$@"' stalled_resolver "$@"
