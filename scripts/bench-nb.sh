#!/usr/bin/env bash
# OVN NB write path: kubeovn-ovn's Northbound API (kube-ovn-bench nb) side by side with the peers of
# shared/peer-bench/nb-peers.sh, in one invocation on fresh ovsdb-servers.
#
# usage: scripts/bench-nb.sh [-n N] [-m PEERS] [extra nb-peers.sh arguments]
#   -n  ports (default 2000)
#   -m  peer methods (default nbctl-batch,ovsdbapp-txn,raw-txn,raw-pipe,raw-pipe-mon)
# Ours: kovn (one transaction per port, 100 in flight, cache on the same connection) and kovn-batch100
# (100 ports per transaction). Needs root and the packages listed in shared/peer-bench/README.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEER_BENCH=${PEER_BENCH:-$ROOT/../shared/peer-bench}
N=2000
PEERS=nbctl-batch,ovsdbapp-txn,raw-txn,raw-pipe,raw-pipe-mon
ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        -n) N=$2; shift 2 ;;
        -m) PEERS=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) ARGS+=("$1"); shift ;;
    esac
done
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
cargo build --release -p kube-ovn-bench --manifest-path "$ROOT/Cargo.toml"
BIN=$CARGO_TARGET_DIR/release/kube-ovn-bench
exec bash "$PEER_BENCH/nb-peers.sh" -n "$N" -m "$PEERS" \
    --ext "kovn=$BIN nb" \
    --ext "kovn-batch100=$BIN nb --batch 100" \
    "${ARGS[@]}"
