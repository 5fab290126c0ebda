//! Leader election with a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does it: the holder
//! renews `renewTime` every retry period; another candidate takes the lease once it has seen the same record
//! (the same resourceVersion and spec) unchanged for `leaseDurationSeconds` of its own clock. Every write
//! carries the resourceVersion read, so two candidates never both win.
//!
//! Time: expiry is judged on the candidate's monotonic clock from when it first saw the current record, as
//! client-go does (`observedTime`), never by comparing another node's `renewTime` with the local wall clock,
//! so clock skew between nodes cannot hand the lease over early. That clock, the retry period and the
//! renewal deadline are tokio's (`tokio::time`), and the Lease API is a trait ([`LeaseApi`], the Kubernetes
//! API by default): tests run the elector against an in-memory store on a paused clock
//! (`#[tokio::test(start_paused = true)]`), deterministically and without sleeping (the controller's
//! `tests/leader.rs`). The wall-clock times written in the Lease (`acquireTime`, `renewTime`) are for people.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;

use super::error::{ControllerError, Result};

/// Lease settings.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease (Kube-OVN: `kube-ovn-controller`).
    pub name: String,
    /// This candidate's identity (the pod name).
    pub identity: String,
    /// How long a lease lasts without renewal.
    pub lease_duration: Duration,
    /// How often the holder renews (and a candidate retries).
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// Kube-OVN's lease `kube-ovn-controller` in `namespace` for `identity`, 15 s lease, 2 s retries.
    pub fn new(namespace: impl Into<String>, identity: impl Into<String>) -> Self {
        LeaseConfig {
            namespace: namespace.into(),
            name: "kube-ovn-controller".to_owned(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What became of a write to the Lease API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseWrite {
    /// Written.
    Done,
    /// Refused with a conflict (HTTP 409): the Lease exists (create) or changed since it was read (replace).
    Conflict,
}

/// The Leases of one namespace, as the elector uses them: the I/O seam ([`KubeLeases`] talks to the
/// Kubernetes API; a test gives an in-memory store with the same resourceVersion rules).
pub trait LeaseApi: Send + Sync + 'static {
    /// The Lease `name`, None if there is none.
    fn get(&self, name: &str) -> impl Future<Output = Result<Option<Lease>>> + Send;
    /// Creates `lease` (named by its metadata); [`LeaseWrite::Conflict`] if one of that name exists.
    fn create(&self, lease: &Lease) -> impl Future<Output = Result<LeaseWrite>> + Send;
    /// Replaces the Lease `name` by `lease` if its `metadata.resourceVersion` is still the stored one;
    /// [`LeaseWrite::Conflict`] if not.
    fn replace(&self, name: &str, lease: &Lease)
        -> impl Future<Output = Result<LeaseWrite>> + Send;
}

/// [`LeaseApi`] over the Kubernetes API.
#[derive(Clone)]
pub struct KubeLeases(Api<Lease>);

impl KubeLeases {
    /// The Leases of `namespace`.
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        KubeLeases(Api::namespaced(client, namespace))
    }
}

impl std::fmt::Debug for KubeLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeLeases").finish_non_exhaustive()
    }
}

fn write_outcome(
    r: std::result::Result<Lease, kube::Error>,
    action: impl FnOnce() -> String,
) -> Result<LeaseWrite> {
    match r {
        Ok(_) => Ok(LeaseWrite::Done),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(LeaseWrite::Conflict),
        Err(e) => Err(ControllerError::kube(action(), e)),
    }
}

impl LeaseApi for KubeLeases {
    async fn get(&self, name: &str) -> Result<Option<Lease>> {
        self.0
            .get_opt(name)
            .await
            .map_err(|e| ControllerError::kube(format!("get lease {name}"), e))
    }

    async fn create(&self, lease: &Lease) -> Result<LeaseWrite> {
        let r = self.0.create(&PostParams::default(), lease).await;
        write_outcome(r, || {
            format!(
                "create lease {}",
                lease.metadata.name.as_deref().unwrap_or_default()
            )
        })
    }

    async fn replace(&self, name: &str, lease: &Lease) -> Result<LeaseWrite> {
        let r = self.0.replace(name, &PostParams::default(), lease).await;
        write_outcome(r, || format!("update lease {name}"))
    }
}

/// The record a candidate last saw (its resourceVersion, which every write changes, and its spec) and when,
/// on tokio's clock, it first saw it.
#[derive(Debug, Clone)]
struct Observed {
    version: Option<String>,
    spec: LeaseSpec,
    at: Instant,
}

/// A candidate for the lease.
#[derive(Clone)]
pub struct LeaderElector<A: LeaseApi = KubeLeases> {
    api: Arc<A>,
    config: LeaseConfig,
    observed: Arc<Mutex<Option<Observed>>>,
}

impl<A: LeaseApi> std::fmt::Debug for LeaderElector<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl LeaderElector<KubeLeases> {
    /// A candidate using `client` (the Lease in `config.namespace`).
    pub fn new(client: kube::Client, config: LeaseConfig) -> Self {
        let api = KubeLeases::new(client, &config.namespace);
        LeaderElector::with_api(api, config)
    }
}

impl<A: LeaseApi> LeaderElector<A> {
    /// A candidate using `api` for the Leases of `config.namespace`.
    pub fn with_api(api: A, config: LeaseConfig) -> Self {
        LeaderElector {
            api: Arc::new(api),
            config,
            observed: Arc::new(Mutex::new(None)),
        }
    }

    /// Notes the record `version`/`spec` as read at `now`; returns since when it has been seen unchanged.
    fn observe(&self, version: Option<&String>, spec: &LeaseSpec, now: Instant) -> Instant {
        let mut o = self.observed.lock().unwrap_or_else(|e| e.into_inner());
        match o.as_ref() {
            Some(seen) if seen.version.as_ref() == version && seen.spec == *spec => seen.at,
            _ => {
                *o = Some(Observed {
                    version: version.cloned(),
                    spec: spec.clone(),
                    at: now,
                });
                now
            }
        }
    }

    /// One attempt to take or renew the lease: Ok(true) if this candidate holds it afterwards.
    ///
    /// Another holder's lease is taken once its record (resourceVersion and spec) has stayed unchanged for
    /// its lease duration since this candidate first saw it, on tokio's clock; a lease with no holder is
    /// taken at once.
    pub async fn try_acquire_or_renew(&self) -> Result<bool> {
        let c = &self.config;
        let dur = i32::try_from(c.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let read = self.api.get(&c.name).await?;
        // When the record was seen: after the read, so the count never starts before it.
        let now = Instant::now();
        let wall = MicroTime(Timestamp::now());
        let Some(mut lease) = read else {
            let spec = LeaseSpec {
                holder_identity: Some(c.identity.clone()),
                lease_duration_seconds: Some(dur),
                acquire_time: Some(wall.clone()),
                renew_time: Some(wall),
                lease_transitions: Some(0),
                ..Default::default()
            };
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(c.name.clone()),
                    namespace: Some(c.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(spec),
            };
            return Ok(self.api.create(&lease).await? == LeaseWrite::Done);
        };
        let version = lease.metadata.resource_version.clone();
        let spec = lease.spec.get_or_insert_with(Default::default);
        let seen_since = self.observe(version.as_ref(), spec, now);
        let mine = spec.holder_identity.as_deref() == Some(c.identity.as_str());
        let free = spec.holder_identity.as_deref().is_none_or(str::is_empty);
        let held_for = Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(dur)).unwrap_or(0),
        );
        let expired = now.duration_since(seen_since) >= held_for;
        if !mine && !free && !expired {
            return Ok(false);
        }
        if !mine {
            spec.holder_identity = Some(c.identity.clone());
            spec.acquire_time = Some(wall.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.renew_time = Some(wall);
        spec.lease_duration_seconds = Some(dur);
        Ok(self.api.replace(&c.name, &lease).await? == LeaseWrite::Done)
    }

    /// Waits until this candidate holds the lease (trying every retry period), then renews it every retry
    /// period in the background. The receiver turns false when the lease is lost: another candidate holds
    /// it, or renewals failed for a whole lease duration since the last one that succeeded; the controller
    /// must stop. The renewals stop when the receiver is dropped.
    pub async fn acquire(self) -> watch::Receiver<bool> {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader election"),
            }
            tokio::time::sleep(self.config.retry_period).await;
        }
        tracing::info!(identity = %self.config.identity, lease = %self.config.name, "became leader");
        let (tx, rx) = watch::channel(true);
        tokio::spawn(async move {
            let mut last_ok = Instant::now();
            loop {
                tokio::time::sleep(self.config.retry_period).await;
                if tx.is_closed() {
                    return;
                }
                match self.try_acquire_or_renew().await {
                    Ok(true) => last_ok = Instant::now(),
                    Ok(false) => {
                        let _ = tx.send(false);
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "lease renewal");
                        if last_ok.elapsed() >= self.config.lease_duration {
                            let _ = tx.send(false);
                            return;
                        }
                    }
                }
            }
        });
        rx
    }
}
