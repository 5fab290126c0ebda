//! Kube-OVN node daemon: serves the CNI shim over a unix socket and plugs pods into OVN.
