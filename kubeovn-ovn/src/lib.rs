//! OVSDB client for OVN and Open vSwitch, written for kubeovn-rs.
//!
//! This crate will hold the RFC 7047 protocol client (with `monitor_cond_since`), the typed models of the
//! `OVN_Northbound` and `Open_vSwitch` schemas and a high-level northbound API behind a trait. It knows
//! nothing of Kubernetes. Nothing is implemented yet: see the project's issue tracker.
