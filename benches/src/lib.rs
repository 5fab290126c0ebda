//! Shared helpers for the kubeovn-rs benchmarks.
