#!/usr/bin/env bash
# OVN NB write path: kubeovn-ovn's Northbound API (kube-ovn-bench nb) side by side with the peers of
# shared/peer-bench/nb-peers.sh, in one invocation on fresh ovsdb-servers.
#
# usage: scripts/bench-nb.sh [-n N] [-m PEERS] [extra nb-peers.sh arguments]
#   -n  ports (default 2000)
#   -m  peer methods (default nbctl-batch,ovsdbapp-txn,raw-txn,raw-pipe,raw-pipe-mon,raw-serial)
# Ours: kovn (one transaction per port, 100 in flight, cache on the same connection), kovn-serial (one at a
# time: its p50_ms/p99_ms are the round trip of a one-port transaction, beside raw-serial's wall_s/n) and
# kovn-batch100 (100 ports per transaction, 4 in flight). Beside it, the raw peer at the same batch size and
# window (scripts/nb_rpc_batch.py): raw-b100 (no monitor) and raw-b100-mon (monitoring LS/LSP, a caching
# client like ours). Needs root and the packages listed in shared/peer-bench/README.md.
#
# The initial sync of a 200,000-row database is another run (not a peer-bench method):
#   kube-ovn-bench nb --db unix:SOCK --server-pid PID sync 200000
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEER_BENCH=${PEER_BENCH:-$ROOT/../shared/peer-bench}
N=2000
PEERS=nbctl-batch,ovsdbapp-txn,raw-txn,raw-pipe,raw-pipe-mon,raw-serial
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
export PEER_BENCH
exec bash "$PEER_BENCH/nb-peers.sh" -n "$N" -m "$PEERS" \
    --ext "kovn=$BIN nb" \
    --ext "kovn-serial=$BIN nb --window 1" \
    --ext "kovn-batch100=$BIN nb --batch 100" \
    --ext "raw-b100=python3 $ROOT/scripts/nb_rpc_batch.py --batch 100 --window 4" \
    --ext "raw-b100-mon=python3 $ROOT/scripts/nb_rpc_batch.py --batch 100 --window 4 --monitor" \
    "${ARGS[@]}"
