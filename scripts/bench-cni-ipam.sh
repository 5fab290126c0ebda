#!/usr/bin/env bash
# ADD and DEL latency of our CNI IPAM plugin (bins/kube-ovn-ipam) next to Debian's host-local, in one run.
#
# usage: scripts/bench-cni-ipam.sh [-n N] [-r REPS]
#   -n  allocations per plugin (default 1000)
#   -r  repetitions (default 1); each repetition runs both plugins, fresh state
#
# Both plugins are exec'd by /work/shared/peer-bench/cni-peers.sh exactly as a runtime does (CNI_* env,
# cniVersion 1.0.0 config on stdin, DEL with prevResult), N sequential ADDs then N DELs, one process each:
# host-local through its `ipam` section, ours through `--cni` (its pod-to-pod ping step fails by design for
# an IPAM-only plugin: there are no interfaces; the script reports it and goes on). Run as root.
# PEER_BENCH=DIR overrides where cni-peers.sh lives.
set -euo pipefail
cd "$(dirname "$0")/.."

N=1000
REPS=1
while [ $# -gt 0 ]; do
    case "$1" in
        -n) N=$2; shift 2 ;;
        -r) REPS=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
PEERS=${PEER_BENCH:-/work/shared/peer-bench}
[ -f "$PEERS/cni-peers.sh" ] || { echo "no $PEERS/cni-peers.sh (set PEER_BENCH)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "run as root: the benchmark creates network namespaces" >&2; exit 1; }

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --quiet --release -p kube-ovn-ipam
BIN_DIR=$CARGO_TARGET_DIR/release

CONF=$(mktemp /tmp/kube-ovn-ipam-bench.XXXXXX.json)
trap 'rm -f "$CONF"' EXIT
# "@SCRATCH@" is the benchmark's own scratch directory (state lives there, removed at exit).
cat >"$CONF" <<'JSON'
{"cniVersion":"1.0.0","name":"pb-kovn","type":"kube-ovn-ipam",
 "ipam":{"type":"kube-ovn-ipam","subnet":"10.91.0.0/16","routes":[{"dst":"0.0.0.0/0"}],"dataDir":"@SCRATCH@/store"}}
JSON

for (( r = 1; r <= REPS; r++ )); do
    echo "== repetition $r/$REPS: host-local (section ipam) and kube-ovn-ipam (--cni), N=$N =="
    bash "$PEERS/cni-peers.sh" -s ipam --ipam-n "$N" -n "$N" --cni "kube-ovn-ipam=$CONF" --cni-path "$BIN_DIR"
done
