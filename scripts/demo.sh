#!/usr/bin/env bash
# kubeovn-rs demo: our CNI IPAM plugin (bins/kube-ovn-ipam) driven by Debian's reference bridge plugin.
#
# Builds the release plugin, installs the Debian packages it needs when missing, creates a "node" network
# namespace and three pod namespaces, runs /usr/lib/cni/bridge (cniVersion 1.0.0) for each pod with
# "ipam": {"type": "kube-ovn-ipam", ...} (pod-c asks for a static address), prints each pod's address, MAC
# and gateway, pings between the pods, shows the IPAM state, then DELs everything and removes what it
# created (also on Ctrl-C or error). Addresses (10.77.0.0/16) exist only inside those namespaces.
# Run as root on Debian 12 with a stable Rust toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "run as root (network namespaces): sudo bash $0" >&2; exit 1; }

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

# --- packages -----------------------------------------------------------------------------------------
PKGS=(containernetworking-plugins iproute2 iputils-ping)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    step "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "cargo is missing: install a stable Rust toolchain (https://rustup.rs)" >&2; exit 1; }

# --- build --------------------------------------------------------------------------------------------
step "building the plugin (cargo build --release -p kube-ovn-ipam)"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --quiet --release -p kube-ovn-ipam
PLUGIN_DIR=$CARGO_TARGET_DIR/release
ls -l "$PLUGIN_DIR/kube-ovn-ipam"

# --- the lab ------------------------------------------------------------------------------------------
TAG=kd$(printf '%04x' $(( RANDOM % 65536 )))   # short: link names have at most 15 characters
NODE=$TAG-node
PODS=(pod-a pod-b pod-c)
NET=demo-$TAG
STATE=$(mktemp -d /tmp/kube-ovn-ipam-demo.XXXXXX)
declare -A RESULT=()
CREATED=()

cleanup() {
    local rc=$? p
    trap - EXIT INT TERM
    if [ ${#CREATED[@]} -gt 0 ]; then
        step "cleaning up"
        for p in "${PODS[@]}"; do
            # DEL is idempotent: run it for every pod, added or not, then remove the namespaces.
            [ -e "/var/run/netns/$TAG-$p" ] && cni DEL "$p" >/dev/null 2>&1 || true
        done
        for ns in "${CREATED[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
        echo "removed namespaces: ${CREATED[*]}"
    fi
    rm -rf "$STATE"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

CONF=$(cat <<JSON
{"cniVersion": "1.0.0", "name": "$NET", "type": "bridge", "bridge": "${TAG}br",
 "isGateway": true, "ipMasq": false, "hairpinMode": false,
 "ipam": {"type": "kube-ovn-ipam", "subnet": "10.77.0.0/16", "excludeIps": ["10.77.0.2..10.77.0.9"],
          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$STATE"}}
JSON
)

# cni COMMAND POD [extra config JSON fragment]: the bridge plugin, in the node namespace, as a runtime runs it.
cni() {
    local conf=$CONF
    [ -n "${3:-}" ] && conf="${CONF%\}}, $3}"
    CNI_COMMAND=$1 CNI_CONTAINERID="$TAG-$2" CNI_NETNS="/var/run/netns/$TAG-$2" CNI_IFNAME=eth0 \
        CNI_PATH="$PLUGIN_DIR:/usr/lib/cni" CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME=$2" \
        nsenter --net="/var/run/netns/$NODE" -- /usr/lib/cni/bridge <<<"$conf"
}

step "network namespaces: node $NODE, pods ${PODS[*]}"
ip netns add "$NODE"; CREATED+=("$NODE")
ip -n "$NODE" link set lo up
for p in "${PODS[@]}"; do ip netns add "$TAG-$p"; CREATED+=("$TAG-$p"); done

step "network config (bridge + kube-ovn-ipam)"
echo "$CONF"

step "CNI ADD for each pod (bridge plugin -> kube-ovn-ipam)"
for p in "${PODS[@]}"; do
    extra=
    # pod-c asks for a static address through runtimeConfig.ips (CNI_ARGS IP= and args.cni.ips work too).
    [ "$p" = pod-c ] && extra='"runtimeConfig": {"ips": ["10.77.0.100/16"]}'
    RESULT[$p]=$(cni ADD "$p" "$extra")
    echo "$p: ADD ok"
done
echo "result of pod-a's ADD:"
echo "${RESULT[pod-a]}"

step "pods"
{
    printf 'POD\tIP\tMAC\tGATEWAY\n'
    for p in "${PODS[@]}"; do
        addr=$(ip -n "$TAG-$p" -4 -o addr show dev eth0 | awk '{print $4}')
        mac=$(ip -n "$TAG-$p" -o link show dev eth0 | sed -n 's/.*link\/ether \([0-9a-f:]*\).*/\1/p')
        gw=$(ip -n "$TAG-$p" route show default | awk '{print $3}')
        printf '%s\t%s\t%s\t%s\n' "$p" "$addr" "$mac" "$gw"
    done
} | column -t -s $'\t'

step "ping between the pods"
for from in "${PODS[@]}"; do
    for to in "${PODS[@]}"; do
        [ "$from" = "$to" ] && continue
        ip=$(ip -n "$TAG-$to" -4 -o addr show dev eth0 | awk '{print $4}'); ip=${ip%/*}
        if ip netns exec "$TAG-$from" ping -c 1 -W 2 "$ip" >/dev/null; then
            echo "$from -> $to ($ip): ok"
        else
            echo "$from -> $to ($ip): FAILED"; exit 1
        fi
    done
done

step "IPAM state ($STATE/$NET/): state (snapshot, one line per allocation) and journal (changes since)"
echo "--- state"; cat "$STATE/$NET/state"
echo "--- journal"; cat "$STATE/$NET/journal"

step "CNI DEL for each pod"
for p in "${PODS[@]}"; do
    cni DEL "$p" "\"prevResult\": ${RESULT[$p]}"
    echo "$p: DEL ok"
done
echo "--- journal after DEL"; cat "$STATE/$NET/journal"
