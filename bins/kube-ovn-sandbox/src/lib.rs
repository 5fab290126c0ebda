//! A single-machine Kube-OVN: starts OVN/OVS, the test API server and our binaries in one state directory.
