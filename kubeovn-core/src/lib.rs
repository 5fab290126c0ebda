//! The Kube-OVN logic of kubeovn-rs: CRD types, annotations, naming and the controllers that translate
//! Kubernetes objects into OVN state, composed from the lower crates through their traits.
//!
//! Nothing is implemented yet: see the project's issue tracker.
