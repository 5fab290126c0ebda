//! Netlink plumbing for pod networking: network namespaces, veth pairs, addresses, routes, MTU and sysctls,
//! spoken over netlink behind a trait.
//!
//! Nothing is implemented yet: see the project's issue tracker.
