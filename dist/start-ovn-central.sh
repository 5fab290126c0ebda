#!/bin/bash
# ovn-central: the NB (tcp 6641) and SB (tcp 6642) databases (created on first start in /etc/ovn) and
# ovn-northd, in the foreground until one of them exits.
set -eu
D=/etc/ovn
mkdir -p "$D" /var/run/ovn /var/log/ovn
[ -f "$D/ovnnb_db.db" ] || ovsdb-tool create "$D/ovnnb_db.db" /usr/share/ovn/ovn-nb.ovsschema
[ -f "$D/ovnsb_db.db" ] || ovsdb-tool create "$D/ovnsb_db.db" /usr/share/ovn/ovn-sb.ovsschema
ovsdb-tool needs-conversion "$D/ovnnb_db.db" /usr/share/ovn/ovn-nb.ovsschema | grep -q yes \
    && ovsdb-tool convert "$D/ovnnb_db.db" /usr/share/ovn/ovn-nb.ovsschema
ovsdb-tool needs-conversion "$D/ovnsb_db.db" /usr/share/ovn/ovn-sb.ovsschema | grep -q yes \
    && ovsdb-tool convert "$D/ovnsb_db.db" /usr/share/ovn/ovn-sb.ovsschema
ovsdb-server --remote=ptcp:6641 --remote=punix:/var/run/ovn/ovnnb_db.sock \
    --pidfile=/var/run/ovn/ovnnb_db.pid --log-file=/var/log/ovn/ovsdb-server-nb.log \
    --unixctl=/var/run/ovn/ovnnb_db.ctl "$D/ovnnb_db.db" &
ovsdb-server --remote=ptcp:6642 --remote=punix:/var/run/ovn/ovnsb_db.sock \
    --pidfile=/var/run/ovn/ovnsb_db.pid --log-file=/var/log/ovn/ovsdb-server-sb.log \
    --unixctl=/var/run/ovn/ovnsb_db.ctl "$D/ovnsb_db.db" &
ovn-northd --ovnnb-db=unix:/var/run/ovn/ovnnb_db.sock --ovnsb-db=unix:/var/run/ovn/ovnsb_db.sock \
    --pidfile=/var/run/ovn/ovn-northd.pid --log-file=/var/log/ovn/ovn-northd.log &
wait -n
