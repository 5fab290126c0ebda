//! An operator's test, whole: the API server in-process (no socket, no port), the operator's CRD applied,
//! its kube-runtime controller running against the server, and the result it wrote read back.
//!
//! `cargo test -p kubeovn-testapi --example operator_test` runs it as the test it would be in an operator's
//! `tests/`; `cargo run -p kubeovn-testapi --example operator_test` runs it once as a program.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::wait::await_condition;
use kube::runtime::watcher;
use kube::{CustomResource, CustomResourceExt, ResourceExt};
use kubeovn_testapi::{Config, TestApiServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The operator's kind: a Greeting names someone, the operator writes the greeting to its status.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "example.kubeovn.io",
    version = "v1",
    kind = "Greeting",
    namespaced,
    status = "GreetingStatus"
)]
pub struct GreetingSpec {
    /// Whom to greet.
    pub name: String,
}

/// What the operator wrote.
#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
pub struct GreetingStatus {
    /// `Hello, NAME!`
    pub message: String,
}

/// The operator's reconciler: the status says hello to the spec's name.
async fn reconcile(g: Arc<Greeting>, api: Arc<Api<Greeting>>) -> Result<Action, kube::Error> {
    let message = format!("Hello, {}!", g.spec.name);
    if g.status.as_ref().map(|s| &s.message) != Some(&message) {
        api.patch_status(
            &g.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"message": message}})),
        )
        .await?;
    }
    Ok(Action::await_change())
}

fn error_policy(_: Arc<Greeting>, _: &kube::Error, _: Arc<Api<Greeting>>) -> Action {
    Action::requeue(Duration::from_millis(100))
}

/// The test: what an operator writes in its own `tests/`.
async fn greeting_gets_its_message() -> Result<String, Box<dyn std::error::Error>> {
    let (server, client) = TestApiServer::in_process(Config::default()).await?;
    server.apply_crds([Greeting::crd()])?;
    let greetings: Api<Greeting> = Api::default_namespaced(client);
    let controller = tokio::spawn(
        Controller::new(greetings.clone(), watcher::Config::default())
            .run(reconcile, error_policy, Arc::new(greetings.clone()))
            .for_each(|_| async {}),
    );

    let g = Greeting::new(
        "world",
        GreetingSpec {
            name: "world".into(),
        },
    );
    greetings.create(&PostParams::default(), &g).await?;
    let written = |g: Option<&Greeting>| g.and_then(|g| g.status.as_ref()).is_some();
    tokio::time::timeout(
        Duration::from_secs(10),
        await_condition(greetings.clone(), "world", written),
    )
    .await??;
    let message = greetings
        .get_status("world")
        .await?
        .status
        .map(|s| s.message)
        .unwrap_or_default();
    assert_eq!(message, "Hello, world!");

    controller.abort();
    server.shutdown().await;
    Ok(message)
}

#[tokio::test]
async fn operator_writes_the_greeting() {
    if let Err(e) = greeting_gets_its_message().await {
        panic!("{e}");
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let message = greeting_gets_its_message().await?;
    println!("the operator wrote {message:?}");
    Ok(())
}
