//! Leader election with a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does it: the holder
//! renews `renewTime`; another candidate takes the lease once `renewTime + leaseDurationSeconds` has passed.
//! Every write carries the resourceVersion read, so two candidates never both win.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::watch;

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

/// A candidate for the lease.
#[derive(Clone)]
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn micros(t: &MicroTime) -> i64 {
    t.0.as_microsecond()
}

impl LeaderElector {
    /// A candidate using `client`.
    pub fn new(client: kube::Client, config: LeaseConfig) -> Self {
        LeaderElector {
            api: Api::namespaced(client, &config.namespace),
            config,
        }
    }

    /// One attempt to take or renew the lease: Ok(true) if this candidate holds it afterwards.
    pub async fn try_acquire_or_renew(&self) -> Result<bool> {
        let now = Timestamp::now();
        let c = &self.config;
        let dur = i32::try_from(c.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let existing = self
            .api
            .get_opt(&c.name)
            .await
            .map_err(|e| ControllerError::kube(format!("get lease {}", c.name), e))?;
        let Some(mut lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(c.name.clone()),
                    namespace: Some(c.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(c.identity.clone()),
                    lease_duration_seconds: Some(dur),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(ControllerError::kube(format!("create lease {}", c.name), e)),
            };
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let mine = spec.holder_identity.as_deref() == Some(c.identity.as_str());
        let held_for = i64::from(spec.lease_duration_seconds.unwrap_or(dur)) * 1_000_000;
        let expired = spec
            .renew_time
            .as_ref()
            .is_none_or(|t| micros(t) + held_for < now.as_microsecond());
        let free = spec.holder_identity.as_deref().is_none_or(str::is_empty);
        if !mine && !expired && !free {
            return Ok(false);
        }
        if !mine {
            spec.holder_identity = Some(c.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds = Some(dur);
        match self
            .api
            .replace(&c.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(ControllerError::kube(format!("update lease {}", c.name), e)),
        }
    }

    /// Waits until this candidate holds the lease, then renews it in the background. The receiver turns
    /// false when the lease is lost (renewal failing for a whole lease duration); the controller must stop.
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
            let mut last_ok = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(self.config.retry_period).await;
                match self.try_acquire_or_renew().await {
                    Ok(true) => last_ok = tokio::time::Instant::now(),
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
                if tx.is_closed() {
                    return;
                }
            }
        });
        rx
    }
}
