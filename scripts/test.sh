#!/usr/bin/env bash
# Runs every check and test of kubeovn-rs on this machine, including the tests that need root, network
# namespaces and the real OVN/OVS daemons. Installs the Debian packages the tests need when they are missing.
#
#   scripts/test.sh            format, lints, all tests, fuzz smoke runs
#   SKIP_LINT=1 scripts/test.sh    tests only
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

# --- system packages ------------------------------------------------------------------------------
# OVN/OVS (real ovsdb-server, northd, vswitchd, controller), Debian's reference CNI plugins, ping and ip;
# ethtool and python3 check pods' offloads and serve TCP/UDP in the e2e tests; nftables' nft reads back the
# masquerade tables our netlink code writes; iperf3 measures pod throughput in the cluster benchmark.
PKGS=(openvswitch-switch ovn-central ovn-host containernetworking-plugins iputils-ping iproute2 util-linux
      ethtool python3 nftables iperf3)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    step "installing ${missing[*]}"
    SUDO=
    [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    # The packages' init scripts may try to start system-wide daemons; the tests start their own.
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null; then
    echo "cargo is missing: install a stable Rust toolchain (https://rustup.rs), then run this again" >&2
    exit 1
fi
# A test that cannot run here (not root, a program missing) prints "SKIPPED <test>: <why>" and passes; with CI
# set to a true value (CI=true, as .ci/run has it) it fails instead (kubeovn-test-support's skip module).
if [ "$(id -u)" != 0 ]; then
    echo "note: not root: the tests that need network namespaces and OVS will say they are skipped (fail with CI=true)"
fi

# --- format and lints -----------------------------------------------------------------------------
if [ -z "${SKIP_LINT:-}" ]; then
    step "cargo fmt --check"
    cargo fmt --all -- --check
    step "cargo clippy"
    cargo clippy --workspace --all-targets --quiet -- -D warnings
    # kubeovn-core's types build and lint without the controller (what the fuzz targets and other users take).
    step "cargo clippy -p kubeovn-core --no-default-features"
    cargo clippy -p kubeovn-core --no-default-features --all-targets --quiet -- -D warnings
    # kubeovn-testapi's server without its kube clients (what the kube-ovn-testapi binary and the fuzz target take).
    step "cargo clippy -p kubeovn-testapi --no-default-features"
    cargo clippy -p kubeovn-testapi --no-default-features --lib --quiet -- -D warnings
fi

# --- tests ----------------------------------------------------------------------------------------
step "cargo test (unit, integration, root and OVN tests, examples, benches in test mode)"
cargo test --workspace --all-targets --no-fail-fast
step "cargo test --doc"
cargo test --workspace --doc

# --- fuzz smoke runs ------------------------------------------------------------------------------
# The fuzz targets assert invariants; a short run on every target keeps them building and honest.
# Long runs: cd fuzz && cargo fuzz run --sanitizer none TARGET
if [ -z "${SKIP_FUZZ:-}" ]; then
    step "fuzz smoke runs"
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}/fuzz
    # Coverage instrumentation as `cargo fuzz build --sanitizer none` adds it (without it libFuzzer only throws
    # random bytes); --target keeps build scripts and proc macros uninstrumented.
    host=$(rustc -vV | sed -n 's/^host: //p')
    RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks" \
        cargo build --quiet --release --target "$host" --manifest-path fuzz/Cargo.toml
    out=$(mktemp)
    for t in $(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^kubeovn-fuzz$'); do
        if ! "$CARGO_TARGET_DIR/$host/release/$t" -max_total_time=15 -print_final_stats=1 >"$out" 2>&1; then
            tail -n 40 "$out"
            echo "fuzz target $t failed" >&2
            exit 1
        fi
        printf '%-16s %s\n' "$t" "$(grep -E '^(Done|stat::new_units_added)' "$out" | tr '\n' ' ')"
    done
    rm -f "$out"
fi
step "all tests passed"
