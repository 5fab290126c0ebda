//! `kube-ovn-daemon`: the node daemon binary.

fn main() {}
