//! The ovsdb-server harness of kubeovn-test-support, under the name these tests use.

#![allow(unused_imports)]

pub use kubeovn_test_support::ovsdb::*;
