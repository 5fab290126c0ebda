//! The Kube-OVN logic of kubeovn-rs: Kube-OVN's CRD types, annotations and naming conventions, and the
//! controllers that translate Kubernetes objects into OVN state, composed from the lower crates through their
//! traits.
//!
//! The types are usable alone, e.g. by an operator that reads what Kube-OVN wrote on a pod:
//!
//! ```
//! use std::collections::BTreeMap;
//! use kubeovn_core::annotations::{PodNetworkAnnotations, DEFAULT_PROVIDER, IP_ADDRESS};
//!
//! let mut anns = BTreeMap::new();
//! anns.insert(IP_ADDRESS.to_owned(), "10.16.0.5,fd00:10:16::5".to_owned());
//! anns.insert("ovn.kubernetes.io/allocated".to_owned(), "true".to_owned());
//! let pod = PodNetworkAnnotations::parse(&anns, DEFAULT_PROVIDER)?;
//! assert!(pod.allocated);
//! assert_eq!(pod.ipv4(), Some("10.16.0.5".parse()?));
//! assert_eq!(kubeovn_core::naming::pod_port("web-0", "default", DEFAULT_PROVIDER), "web-0.default");
//!
//! // Kube-OVN manifests deserialize into the CRD types; `crd::crds_yaml()` is what `kubectl apply` takes.
//! let subnet: kubeovn_core::crd::Subnet = serde_json::from_str(
//!     r#"{"apiVersion":"kubeovn.io/v1","kind":"Subnet","metadata":{"name":"ls1"},
//!         "spec":{"cidrBlock":"10.66.0.0/16","gateway":"10.66.0.1","natOutgoing":true}}"#,
//! )?;
//! assert!(subnet.spec.nat_outgoing);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Features
//!
//! - `controller` (default): the `controller` and `events` modules, with the Kubernetes client and
//!   watchers (kube's `client` and `runtime`), the northbound client, tokio and metrics. Without it
//!   (`default-features = false`) the crate is the types alone: annotations, naming, CRDs and conditions.
//!
//! # Kubernetes version
//!
//! As k8s-openapi asks of libraries, this crate does not choose the Kubernetes API version: the binary does,
//! with the feature of its own k8s-openapi dependency (`k8s-openapi = { version = "0.29", features =
//! ["v1_37"] }`). To build the crate alone (`cargo build -p kubeovn-core`, `cargo doc`), set
//! `K8S_OPENAPI_ENABLED_VERSION=1.37`; this workspace sets it in `.cargo/config.toml`.

pub mod annotations;
#[cfg(feature = "controller")]
pub mod controller;
pub mod crd;
pub mod error;
#[cfg(feature = "controller")]
pub mod events;
pub mod naming;
pub mod netpol;
pub mod selector;
pub mod services;

pub use error::{AnnotationError, Error, Problem, Result};
pub use kubeovn_ipam::Mac;
