#!/bin/bash
# ovs-ovn: ovsdb-server and ovs-vswitchd (kernel datapath, the openvswitch module loaded from the host's
# /lib/modules) and ovn-controller; kube-ovn-daemon writes the chassis settings (system-id, ovn-remote,
# encap) and br-int at node start. Foreground until one of them exits.
set -eu
mkdir -p /etc/openvswitch /run/openvswitch /var/log/openvswitch /run/ovn
modprobe openvswitch 2>/dev/null || true
[ -f /etc/openvswitch/conf.db ] || ovsdb-tool create /etc/openvswitch/conf.db /usr/share/openvswitch/vswitch.ovsschema
ovsdb-server --remote=punix:/run/openvswitch/db.sock --pidfile=/run/openvswitch/ovsdb-server.pid \
    --log-file=/var/log/openvswitch/ovsdb-server.log /etc/openvswitch/conf.db &
until ovs-vsctl --timeout=2 --no-wait init 2>/dev/null; do sleep 0.2; done
ovs-vswitchd unix:/run/openvswitch/db.sock --pidfile=/run/openvswitch/ovs-vswitchd.pid \
    --log-file=/var/log/openvswitch/ovs-vswitchd.log --mlockall &
ovn-controller unix:/run/openvswitch/db.sock --pidfile=/run/ovn/ovn-controller.pid \
    --log-file=/var/log/openvswitch/ovn-controller.log &
wait -n
