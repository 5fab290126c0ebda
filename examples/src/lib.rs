//! Runnable examples of the kubeovn-rs crates: see the `[[example]]` targets.
