//! What the root tests share: unique names and a named network namespace removed on drop (also on panic).

#![allow(dead_code)] // Each test file uses its part.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use kubeovn_netdev::{delete_named_netns, NamedNetns, Namespaces, NETNS_RUN_DIR};

/// A short unique suffix: pid and a counter, so names stay within 15 bytes (`v` + 9 + 1 + up to 4 = 15).
pub fn suffix() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}{}",
        std::process::id() % 100_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A named namespace (`kotest-<tag>-<suffix>`) removed on drop.
pub struct TestNs {
    /// Its name under the netns directory.
    pub name: String,
    /// Its path.
    pub path: PathBuf,
}

impl TestNs {
    /// Creates it.
    pub fn new(tag: &str) -> Self {
        let name = format!("kotest-{tag}-{}", suffix());
        let path = NamedNetns::default().create(&name).expect("create netns");
        TestNs { name, path }
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        let _ = delete_named_netns(Path::new(NETNS_RUN_DIR), &self.name);
    }
}
