//! Kube-OVN IP and MAC allocation (in progress).
