//! Lease-based leader election against the test API server: one holder at a time, renewals keep it, an
//! expired lease is taken over, and a lost lease is reported.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use kubeovn_testapi::{Config, TestApiServer};
use kubeovn_core::controller::{LeaderElector, LeaseConfig};

fn lease(identity: &str, secs: u64) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(secs),
        retry_period: Duration::from_millis(100),
        ..LeaseConfig::new("default", identity)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_then_takeover_after_expiry() {
    let api = TestApiServer::start(Config::default()).await.unwrap();
    let client = kube::Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    let a = LeaderElector::new(client.clone(), lease("a", 1));
    let b = LeaderElector::new(client.clone(), lease("b", 1));
    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(
        !b.try_acquire_or_renew().await.unwrap(),
        "b took a held lease"
    );
    assert!(a.try_acquire_or_renew().await.unwrap(), "a could not renew");
    // a stops renewing: after the lease duration b takes over.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        b.try_acquire_or_renew().await.unwrap(),
        "b did not take the expired lease"
    );
    assert!(!a.try_acquire_or_renew().await.unwrap());

    // A leader that keeps renewing in the background is never displaced; when someone else takes the
    // lease (here: by force), the holder is told.
    let c = LeaderElector::new(client.clone(), lease("c", 1));
    let mut rx = tokio::time::timeout(Duration::from_secs(10), c.acquire())
        .await
        .unwrap();
    let d = LeaderElector::new(client.clone(), lease("d", 1));
    for _ in 0..10 {
        assert!(
            !d.try_acquire_or_renew().await.unwrap(),
            "d took a lease c renews"
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    assert!(*rx.borrow());
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client.clone(), "default");
    let mut l = leases.get("kube-ovn-controller").await.unwrap();
    l.spec.as_mut().unwrap().holder_identity = Some("intruder".into());
    leases
        .replace("kube-ovn-controller", &Default::default(), &l)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), rx.changed())
        .await
        .unwrap()
        .unwrap();
    assert!(!*rx.borrow(), "the lost lease was not reported");
}
