//! Lease-based leader election. The elector's decisions on a paused tokio clock against an in-memory Lease
//! store with the API server's resourceVersion rules (deterministic: exact times, no sleeping): one holder at
//! a time, a renewed lease is never taken, an unrenewed one is taken exactly one lease duration after the
//! candidate first saw its record, a lost lease is reported at the renewal that finds it. Then one run
//! against the test API server over HTTP, on the real clock, that waits (bounded) only for things to happen.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kubeovn_core::controller::error::{ControllerError, Result};
use kubeovn_core::controller::leader::{LeaseApi, LeaseWrite};
use kubeovn_core::controller::{LeaderElector, LeaseConfig};
use kubeovn_testapi::{Config, TestApiServer};
use tokio::time::Instant;

fn lease(identity: &str, secs: u64) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(secs),
        retry_period: Duration::from_millis(100),
        ..LeaseConfig::new("default", identity)
    }
}

const NAME: &str = "kube-ovn-controller";
const MS: Duration = Duration::from_millis(1);

#[derive(Default)]
struct State {
    leases: HashMap<String, Lease>,
    version: u64,
    down: bool,
    /// Successful writes (create or replace) by the holder they name.
    writes: HashMap<String, usize>,
}

/// An in-memory Lease store with the API server's rules: a create of an existing name and a replace whose
/// resourceVersion is not the stored one are conflicts; every write gets a new resourceVersion. It can be
/// taken down (every call fails) and written behind the candidates' backs.
#[derive(Clone, Default)]
struct Leases(Arc<Mutex<State>>);

impl Leases {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap()
    }

    fn store(st: &mut State, mut lease: Lease) {
        st.version += 1;
        lease.metadata.resource_version = Some(st.version.to_string());
        let spec = lease.spec.clone().unwrap_or_default();
        *st.writes
            .entry(spec.holder_identity.unwrap_or_default())
            .or_default() += 1;
        st.leases
            .insert(lease.metadata.name.clone().unwrap_or_default(), lease);
    }

    fn set_down(&self, down: bool) {
        self.state().down = down;
    }

    /// Writes the holder of the lease directly, as another party would.
    fn force_holder(&self, holder: &str) {
        let mut st = self.state();
        let mut l = st.leases[NAME].clone();
        l.spec.as_mut().unwrap().holder_identity = Some(holder.to_owned());
        Self::store(&mut st, l);
    }

    fn holder(&self) -> Option<String> {
        self.state()
            .leases
            .get(NAME)?
            .spec
            .as_ref()?
            .holder_identity
            .clone()
    }

    fn transitions(&self) -> Option<i32> {
        self.state()
            .leases
            .get(NAME)?
            .spec
            .as_ref()?
            .lease_transitions
    }

    fn writes(&self, holder: &str) -> usize {
        self.state().writes.get(holder).copied().unwrap_or(0)
    }

    fn check_up(st: &State) -> Result<()> {
        if st.down {
            return Err(ControllerError::NotReady("the lease API".into()));
        }
        Ok(())
    }
}

impl LeaseApi for Leases {
    async fn get(&self, name: &str) -> Result<Option<Lease>> {
        let st = self.state();
        Self::check_up(&st)?;
        Ok(st.leases.get(name).cloned())
    }

    async fn create(&self, lease: &Lease) -> Result<LeaseWrite> {
        let mut st = self.state();
        Self::check_up(&st)?;
        let name = lease.metadata.name.clone().unwrap_or_default();
        if st.leases.contains_key(&name) {
            return Ok(LeaseWrite::Conflict);
        }
        Self::store(&mut st, lease.clone());
        Ok(LeaseWrite::Done)
    }

    async fn replace(&self, name: &str, lease: &Lease) -> Result<LeaseWrite> {
        let mut st = self.state();
        Self::check_up(&st)?;
        let Some(current) = st.leases.get(name) else {
            return Err(ControllerError::NotReady(format!("lease {name}")));
        };
        if current.metadata.resource_version != lease.metadata.resource_version {
            return Ok(LeaseWrite::Conflict);
        }
        Self::store(&mut st, lease.clone());
        Ok(LeaseWrite::Done)
    }
}

fn candidate(leases: &Leases, identity: &str) -> LeaderElector<Leases> {
    LeaderElector::with_api(leases.clone(), lease(identity, 1))
}

/// One holder; another candidate takes an unrenewed lease exactly one lease duration after it first saw
/// the record, not a millisecond before; the old holder then finds it taken.
#[tokio::test(start_paused = true)]
async fn takeover_exactly_one_lease_duration_after_the_record_was_first_seen() {
    let leases = Leases::default();
    let (a, b) = (candidate(&leases, "a"), candidate(&leases, "b"));
    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(a.try_acquire_or_renew().await.unwrap(), "a could not renew");
    assert!(
        !b.try_acquire_or_renew().await.unwrap(),
        "b took a held lease"
    );
    tokio::time::advance(999 * MS).await;
    assert!(
        !b.try_acquire_or_renew().await.unwrap(),
        "b took the lease before it expired"
    );
    tokio::time::advance(MS).await;
    assert!(
        b.try_acquire_or_renew().await.unwrap(),
        "b did not take the expired lease"
    );
    assert_eq!(leases.holder().as_deref(), Some("b"));
    assert_eq!(leases.transitions(), Some(1));
    assert!(!a.try_acquire_or_renew().await.unwrap(), "a took it back");
    assert_eq!(leases.holder().as_deref(), Some("b"));
}

/// Each renewal the candidate sees starts its count again: the lease is taken one lease duration after
/// the last renewal seen, however long the lease has been held.
#[tokio::test(start_paused = true)]
async fn a_renewal_seen_restarts_the_count() {
    let leases = Leases::default();
    let (a, b) = (candidate(&leases, "a"), candidate(&leases, "b"));
    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(!b.try_acquire_or_renew().await.unwrap());
    tokio::time::advance(600 * MS).await;
    assert!(a.try_acquire_or_renew().await.unwrap());
    tokio::time::advance(600 * MS).await;
    // 1.2 s since b first saw the lease, 0 since it saw this renewal.
    assert!(!b.try_acquire_or_renew().await.unwrap());
    tokio::time::advance(999 * MS).await;
    assert!(!b.try_acquire_or_renew().await.unwrap());
    tokio::time::advance(MS).await;
    assert!(b.try_acquire_or_renew().await.unwrap());
}

/// A record whose renewTime is long past (a holder that died, or whose clock is behind) is still given a
/// whole lease duration of the candidate's own clock; a lease with no holder is taken at once.
#[tokio::test(start_paused = true)]
async fn an_old_renew_time_is_not_trusted_and_a_free_lease_is_taken_at_once() {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    let leases = Leases::default();
    let an_hour_ago =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_hours(1);
    let stale = |holder: &str| Lease {
        metadata: ObjectMeta {
            name: Some(NAME.into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(1),
            renew_time: Some(MicroTime(an_hour_ago)),
            ..Default::default()
        }),
    };
    assert_eq!(leases.create(&stale("x")).await.unwrap(), LeaseWrite::Done);
    let b = candidate(&leases, "b");
    assert!(!b.try_acquire_or_renew().await.unwrap());
    tokio::time::advance(999 * MS).await;
    assert!(!b.try_acquire_or_renew().await.unwrap());
    tokio::time::advance(MS).await;
    assert!(b.try_acquire_or_renew().await.unwrap());

    let free = Leases::default();
    free.create(&stale("")).await.unwrap();
    assert!(candidate(&free, "c").try_acquire_or_renew().await.unwrap());
    assert_eq!(free.holder().as_deref(), Some("c"));
}

/// `acquire` retries every retry period and returns at the first one that finds the lease expired: exactly
/// one lease duration after it started, the holder not renewing.
#[tokio::test(start_paused = true)]
async fn acquire_waits_for_expiry() {
    let leases = Leases::default();
    assert!(candidate(&leases, "a")
        .try_acquire_or_renew()
        .await
        .unwrap());
    let t0 = Instant::now();
    let rx = candidate(&leases, "b").acquire().await;
    assert_eq!(t0.elapsed(), Duration::from_secs(1));
    assert!(*rx.borrow());
    assert_eq!(leases.holder().as_deref(), Some("b"));
}

/// A leader renewing in the background (every 100 ms) is never displaced over ten lease durations of
/// another candidate's tries; when someone takes the lease behind its back, the next renewal (within one
/// retry period) reports it lost.
#[tokio::test(start_paused = true)]
async fn a_renewing_leader_keeps_the_lease_and_hears_when_it_is_taken() {
    let leases = Leases::default();
    let t0 = Instant::now();
    let mut rx = candidate(&leases, "c").acquire().await;
    assert_eq!(t0.elapsed(), Duration::ZERO);
    let d = candidate(&leases, "d");
    // Tries every 150 ms for 10.05 s: the renewal timers between them fire first (a paused clock jumps
    // from timer to timer).
    for _ in 0..67 {
        assert!(
            !d.try_acquire_or_renew().await.unwrap(),
            "d took a lease c renews, at {:?}",
            t0.elapsed()
        );
        tokio::time::sleep(150 * MS).await;
    }
    assert_eq!(t0.elapsed(), 10050 * MS);
    // Created at 0, renewed at 100, 200, ..., 10000 ms.
    assert_eq!(leases.writes("c"), 101);
    assert_eq!(leases.writes("d"), 0);
    assert!(*rx.borrow());
    leases.force_holder("intruder");
    rx.changed().await.unwrap();
    assert!(!*rx.borrow(), "the lost lease was not reported");
    assert_eq!(t0.elapsed(), 10100 * MS);
    assert_eq!(leases.holder().as_deref(), Some("intruder"));
}

/// Renewals failing for less than a lease duration keep the lease; failing for a whole lease duration since
/// the last one that succeeded, the leader gives it up (at that renewal, not later).
#[tokio::test(start_paused = true)]
async fn renewals_failing_for_a_lease_duration_lose_it() {
    let leases = Leases::default();
    let t0 = Instant::now();
    let mut rx = candidate(&leases, "c").acquire().await;
    tokio::time::sleep(250 * MS).await;
    assert_eq!(leases.writes("c"), 3);
    // Down from 250 to 750 ms: the renewals at 300 .. 700 fail.
    leases.set_down(true);
    tokio::time::sleep(500 * MS).await;
    assert!(*rx.borrow());
    assert_eq!(leases.writes("c"), 3);
    leases.set_down(false);
    tokio::time::sleep(100 * MS).await;
    // The renewal at 800 ms went through.
    assert_eq!(leases.writes("c"), 4);
    assert!(*rx.borrow());
    leases.set_down(true);
    rx.changed().await.unwrap();
    assert!(!*rx.borrow());
    // Given up at the first renewal a whole lease duration after the last success (800 ms).
    assert_eq!(t0.elapsed(), 1800 * MS);
    assert_eq!(leases.writes("c"), 4);
}

/// Against the test API server over HTTP, on the real clock, waiting only for things to happen (bounded):
/// a holds the lease and stops renewing; b's `acquire` takes it over once it expired, not before a lease
/// duration; the lease then names b; a renewing b hears when someone takes the lease behind its back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_the_api_server_takeover_after_expiry_and_loss_reported() {
    let api = TestApiServer::start(Config::default()).await.unwrap();
    let client = api.client().unwrap();
    let a = LeaderElector::new(client.clone(), lease("a", 1));
    let b = LeaderElector::new(client.clone(), lease("b", 1));
    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(
        !b.try_acquire_or_renew().await.unwrap(),
        "b took a held lease"
    );
    let t0 = std::time::Instant::now();
    let mut rx = tokio::time::timeout(Duration::from_secs(10), b.acquire())
        .await
        .expect("b became leader within 10 s");
    assert!(t0.elapsed() >= Duration::from_secs(1), "{:?}", t0.elapsed());
    assert!(*rx.borrow());
    let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), "default");
    let l = leases.get(NAME).await.unwrap();
    let spec = l.spec.as_ref().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("b"));
    assert_eq!(spec.lease_transitions, Some(1));
    assert!(!a.try_acquire_or_renew().await.unwrap());

    // The intruder's write, again if it raced one of b's renewals (a conflict).
    for attempt in 0.. {
        assert!(attempt < 50, "the intruder's write kept conflicting");
        let mut l = leases.get(NAME).await.unwrap();
        l.spec.as_mut().unwrap().holder_identity = Some("intruder".into());
        match leases.replace(NAME, &Default::default(), &l).await {
            Ok(_) => break,
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("replace lease: {e}"),
        }
    }
    tokio::time::timeout(Duration::from_secs(5), rx.changed())
        .await
        .expect("the loss reported within 5 s")
        .unwrap();
    assert!(!*rx.borrow(), "the lost lease was not reported");
}
