#!/usr/bin/env bash
# ADD and DEL latency of our CNI IPAM plugin (bins/kube-ovn-ipam) next to Debian's host-local, in one run.
# Prints cni-peers.sh's table: "ipam host-local ADD/DEL/VERSION" rows, then "kovn" (default build) and
# "kovn-static" (static build) ADD/DEL rows; the results TSV is kept under /tmp/peerbench-run/results/.
#
# usage: scripts/bench-cni-ipam.sh [-n N] [-r REPS]
#   -n  allocations per plugin (default 1000)
#   -r  repetitions (default 1); each repetition runs both plugins, fresh state
#
# Both plugins are exec'd by shared/peer-bench/cni-peers.sh exactly as a runtime does (CNI_* env,
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
PEERS=${PEER_BENCH:-$PWD/../shared/peer-bench}
[ -f "$PEERS/cni-peers.sh" ] || { echo "no $PEERS/cni-peers.sh (set PEER_BENCH)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "run as root: the benchmark creates network namespaces" >&2; exit 1; }

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
# Two builds of the same code: the default (dynamically linked, like Debian's host-local) and a static one
# (-C target-feature=+crt-static; --target keeps the flag away from build scripts and proc macros), which
# skips the dynamic loader at every exec.
HOST=$(rustc -vV | sed -n 's/^host: //p')
echo "building kube-ovn-ipam (release, dynamic and static)"
cargo build --quiet --release -p kube-ovn-ipam
RUSTFLAGS="-C target-feature=+crt-static" cargo build --quiet --release -p kube-ovn-ipam --target "$HOST"
BIN_DIR=$(mktemp -d /tmp/kube-ovn-ipam-bench.XXXXXX)
CONF_DYN=$BIN_DIR/dynamic.json
CONF_STATIC=$BIN_DIR/static.json
trap 'rm -rf "$BIN_DIR"' EXIT
# The plugin ignores its own name, so the two builds sit side by side under two names.
cp "$CARGO_TARGET_DIR/release/kube-ovn-ipam" "$BIN_DIR/kube-ovn-ipam"
cp "$CARGO_TARGET_DIR/$HOST/release/kube-ovn-ipam" "$BIN_DIR/kube-ovn-ipam-static"

# "@SCRATCH@" is the benchmark's own scratch directory (state lives there, removed at exit).
for t in kube-ovn-ipam kube-ovn-ipam-static; do
    cat >"$BIN_DIR/$t.json" <<JSON
{"cniVersion":"1.0.0","name":"pb-kovn","type":"$t",
 "ipam":{"type":"kube-ovn-ipam","subnet":"10.91.0.0/16","routes":[{"dst":"0.0.0.0/0"}],"dataDir":"@SCRATCH@/store"}}
JSON
done
mv "$BIN_DIR/kube-ovn-ipam.json" "$CONF_DYN"; mv "$BIN_DIR/kube-ovn-ipam-static.json" "$CONF_STATIC"

for (( r = 1; r <= REPS; r++ )); do
    echo "== repetition $r/$REPS: host-local (section ipam), kube-ovn-ipam dynamic and static (--cni), N=$N =="
    # Alternate the order of our two builds between repetitions (the peers' section always runs first).
    if (( r % 2 )); then order=("kovn=$CONF_DYN" "kovn-static=$CONF_STATIC"); else order=("kovn-static=$CONF_STATIC" "kovn=$CONF_DYN"); fi
    bash "$PEERS/cni-peers.sh" -s ipam --ipam-n "$N" -n "$N" --cni "${order[0]}" --cni "${order[1]}" --cni-path "$BIN_DIR"
done
