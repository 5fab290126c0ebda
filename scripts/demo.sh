#!/usr/bin/env bash
# kubeovn-rs demo: a whole Kube-OVN on this machine, with `kube-ovn-sandbox up`.
#
# Installs the Debian packages it needs when missing (Open vSwitch, OVN, ping), builds our binaries
# (cargo build --release: kube-ovn-sandbox, kube-ovn-testapi, kube-ovn-controller, kube-ovn-daemon, the CNI
# shim kube-ovn and kubectl-ko), then runs `kube-ovn-sandbox up`: NB/SB ovsdb-servers, ovn-northd,
# ovs-vswitchd (userspace datapath) and ovn-controller, the in-memory Kubernetes API, kube-ovn-controller,
# kube-ovn-daemon and a sandbox kubelet, all in the background in one state directory; a second subnet bound
# to a namespace and a few pods in both subnets; a table of the pods and a ping matrix between them.
# The sandbox stays up: the script ends with the commands to use it and to take it down.
#
#   bash scripts/demo.sh                 (as root, or with sudo available; needs a stable Rust toolchain)
#   STATE_DIR=/tmp/sbx bash scripts/demo.sh [kube-ovn-sandbox up flags, e.g. --demo-pods 5]
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
SUDO=
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "run as root: the sandbox makes network namespaces and an OVS bridge" >&2; exit 1; }
    SUDO=sudo
fi

# --- packages (as scripts/test.sh installs them) ------------------------------------------------------
PKGS=(openvswitch-switch ovn-central ovn-host iputils-ping iproute2)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    step "installing ${missing[*]}"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    # The packages' init scripts may start system-wide daemons; the sandbox starts its own.
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "cargo is missing: install a stable Rust toolchain (https://rustup.rs), then run this again" >&2; exit 1; }

# --- build (as the calling user) ----------------------------------------------------------------------
step "building (cargo build --release)"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
PKGS_BUILD=(-p kube-ovn-sandbox -p kube-ovn-testapi -p kube-ovn-controller -p kube-ovn-daemon -p kube-ovn-cni)
[ -d bins/kubectl-ko ] && PKGS_BUILD+=(-p kubectl-ko)
cargo build --quiet --release "${PKGS_BUILD[@]}"
BIN=$CARGO_TARGET_DIR/release
STATE_DIR=${STATE_DIR:-/var/lib/kube-ovn-sandbox}

# --- up -----------------------------------------------------------------------------------------------
step "kube-ovn-sandbox up --state-dir $STATE_DIR"
$SUDO "$BIN/kube-ovn-sandbox" up --state-dir "$STATE_DIR" --bin-dir "$BIN" "$@"

cat <<MSG

The sandbox is up and stays up. Try:
  ${SUDO:+$SUDO }$BIN/kube-ovn-sandbox status --state-dir $STATE_DIR
  ${SUDO:+$SUDO }$BIN/kube-ovn-sandbox exec --state-dir $STATE_DIR demo/app-1 -- ping -c 3 <web-1's IP above>
  ${SUDO:+$SUDO }kubectl --kubeconfig $STATE_DIR/kubeconfig get pods -A -o wide      (if kubectl is installed)
  ${SUDO:+$SUDO }kubectl --kubeconfig $STATE_DIR/kubeconfig run extra --image=pause  (gets a netns and an IP)
  ${SUDO:+$SUDO }env KUBE_OVN_SANDBOX_DIR=$STATE_DIR $BIN/kubectl-ko nbctl show
  ${SUDO:+$SUDO }env KUBE_OVN_SANDBOX_DIR=$STATE_DIR $BIN/kubectl-ko diagnose
Take it down (stops every process by pid, removes its network namespaces and links):
  ${SUDO:+$SUDO }$BIN/kube-ovn-sandbox down --state-dir $STATE_DIR
MSG
