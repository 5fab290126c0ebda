#!/usr/bin/env bash
# The node-side benchmark (as root): our shim + kube-ovn-daemon on a single-node OVN, beside Debian's
# bridge/ptp + host-local in the same run (bins/kube-ovn-daemon/examples/cni_bench.rs says what each phase is).
#   bash scripts/bench-cni.sh [-n 200] [--burst 100] [--grow 500]      (extra arguments go to cni_bench)
# The shim is built as the image ships it: statically linked (-C target-feature=+crt-static; --target keeps
# the flag away from build scripts and proc macros), which spares the dynamic loader at every exec.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run as root: the benchmark creates network namespaces and veths" >&2; exit 1; }
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
HOST=$(rustc -vV | sed -n 's/^host: //p')
echo "building the daemon and cni_bench (release) and the static shim"
cargo build --quiet --release -p kube-ovn-daemon --example cni_bench
RUSTFLAGS="-C target-feature=+crt-static" cargo build --quiet --release -p kube-ovn-cni --target "$HOST"
ARGS=("$@")
[ ${#ARGS[@]} -gt 0 ] || ARGS=(-n 200 --burst 100 --grow 500)
exec "$CARGO_TARGET_DIR/release/examples/cni_bench" "${ARGS[@]}" --peers \
    --shim "$CARGO_TARGET_DIR/$HOST/release/kube-ovn"
