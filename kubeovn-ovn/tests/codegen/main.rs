//! The checked-in models (`src/models/`) are what the generator (`generator.rs`, a development tool of
//! this crate, not part of its API) makes of the shipped schemas.
//! `KUBEOVN_REGEN=1 cargo test -p kubeovn-ovn --test codegen` rewrites them.

mod generator;

use std::path::Path;

use generator::generate;
use kubeovn_ovn::DatabaseSchema;

fn check(schema_file: &str, module: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text =
        std::fs::read_to_string(root.join("schemas").join(schema_file)).expect("schema file");
    let schema = DatabaseSchema::parse_str(&text).expect("schema");
    let code = generate(&schema, &format!("schemas/{schema_file}"));
    let path = root.join("src/models").join(format!("{module}.rs"));
    if std::env::var_os("KUBEOVN_REGEN").is_some() {
        std::fs::write(&path, &code).expect("write models");
        return;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        current == code,
        "{} is stale: run KUBEOVN_REGEN=1 cargo test -p kubeovn-ovn --test codegen",
        path.display()
    );
}

#[test]
fn northbound_models_are_current() {
    check("ovn-nb.ovsschema", "nb");
}

#[test]
fn open_vswitch_models_are_current() {
    check("vswitch.ovsschema", "ovs");
}
