#!/usr/bin/env python3
"""The raw JSON-RPC peer (shared/peer-bench/nb_rpc.py) at K ports per transaction, for nb-peers.sh --ext.

  nb_rpc_batch.py [--batch K] [--window W] [--monitor] --db unix:SOCK [--server-pid PID] create N | delete

Each transaction inserts K ports shaped as nb_rpc.py's (pod-<i>.bench, "MAC IP", vendor/ls/pod) and mutates
the switch's ports once with the K named-uuids; W transactions are in flight on one connection. --monitor adds
nb_rpc.py's monitor_cond on LS/LSP (a caching client). delete removes the ports K per transaction (one ports
mutation; the unreferenced rows are garbage collected). Requests are encoded before the clock starts.
Prints nb_rpc.py's key=value line.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.environ.get("PEER_BENCH", os.path.join(os.path.dirname(__file__), "../../shared/peer-bench")))
import nb_rpc  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--server-pid", type=int, default=0)
    ap.add_argument("--ls", default="ls0")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--monitor", action="store_true")
    ap.add_argument("mode", choices=["create", "delete"])
    ap.add_argument("args", nargs="*")
    a = ap.parse_args()
    c = nb_rpc.Conn(a.db)
    ls = nb_rpc.ls_uuid(c, a.ls)
    if a.monitor:
        nb_rpc.monitor(c)
    where = [["_uuid", "==", ls]]
    payloads = []
    if a.mode == "create":
        n = int(a.args[0])
        for lo in range(0, n, a.batch):
            rng = range(lo, min(lo + a.batch, n))
            ops = [nb_rpc.lsp_insert(i, a.ls, f"p{i}") for i in rng]
            ops.append({"op": "mutate", "table": "Logical_Switch", "where": where,
                        "mutations": [["ports", "insert", ["set", [["named-uuid", f"p{i}"] for i in rng]]]]})
            payloads.append(nb_rpc.encode(c, ops))
    else:
        uu = nb_rpc.port_uuids(c)
        n = len(uu)
        for lo in range(0, n, a.batch):
            ops = [{"op": "mutate", "table": "Logical_Switch", "where": where,
                    "mutations": [["ports", "delete", ["set", [["uuid", u] for u in uu[lo:lo + a.batch]]]]]}]
            payloads.append(nb_rpc.encode(c, ops))
    c.next_id -= len(payloads)
    s0, u0, t0 = nb_rpc.cpu_ticks(a.server_pid), nb_rpc.self_cpu(), time.perf_counter()
    nb_rpc.run_pipelined(c, payloads, a.window)
    t1, u1, s1 = time.perf_counter(), nb_rpc.self_cpu(), nb_rpc.cpu_ticks(a.server_pid)
    hz = os.sysconf("SC_CLK_TCK")
    wall = t1 - t0
    print(f"wall_s={wall:.3f} n={n} rate={n / wall if wall else 0:.0f} server_cpu_s={(s1 - s0) / hz:.2f} "
          f"client_cpu_s={u1 - u0:.2f} txns={len(payloads)} window={a.window} batch={a.batch} "
          f"updates={c.updates}")


if __name__ == "__main__":
    main()
