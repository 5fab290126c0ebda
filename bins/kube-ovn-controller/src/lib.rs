//! Kube-OVN controller: translates Kubernetes objects into OVN northbound state.
