//! Prometheus metrics of the controller (prometheus-client): pod add latency, work queue depth, IPAM usage
//! per subnet, northbound transaction latency and size.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

type Labels = Vec<(&'static str, String)>;

fn latency_histogram() -> Histogram {
    // 100 µs .. ~13 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

struct Inner {
    registry: Registry,
    pod_add: Histogram,
    nb_txn: Family<Labels, Histogram, fn() -> Histogram>,
    nb_ops: Counter,
    queue_depth: Family<Labels, Gauge>,
    ipam_using: Family<Labels, Gauge>,
    ipam_available: Family<Labels, Gauge>,
    handler_errors: Family<Labels, Counter>,
    handler_panics: Family<Labels, Counter>,
    reconcile: Family<Labels, Histogram, fn() -> Histogram>,
    services: Gauge,
    service_backends: Gauge,
    service_programming: Histogram,
}

/// One kind's reconciler run times and failures (shares the registered metrics; cheap to clone).
#[derive(Clone, Debug)]
pub struct ReconcileMetrics {
    ok: Histogram,
    error: Histogram,
    errors: Counter,
}

impl ReconcileMetrics {
    /// Records one run that took `d` (a failure also counted in `handler_errors`).
    pub fn observe(&self, d: Duration, ok: bool) {
        if ok {
            self.ok.observe(d.as_secs_f64());
        } else {
            self.error.observe(d.as_secs_f64());
            self.errors.inc();
        }
    }
}

/// The controller's metrics; cheap to clone.
#[derive(Clone)]
pub struct Metrics(Arc<Inner>);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Metrics registered under the `kube_ovn_controller` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("kube_ovn_controller");
        let pod_add = latency_histogram();
        let nb_txn: Family<Labels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        let nb_ops = Counter::default();
        let queue_depth = Family::<Labels, Gauge>::default();
        let ipam_using = Family::<Labels, Gauge>::default();
        let ipam_available = Family::<Labels, Gauge>::default();
        let handler_errors = Family::<Labels, Counter>::default();
        let handler_panics = Family::<Labels, Counter>::default();
        let reconcile: Family<Labels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "pod_add_seconds",
            "Time from a pod handler's start to its annotation patch",
            pod_add.clone(),
        );
        registry.register(
            "nb_transaction_seconds",
            "Northbound transaction latency by outcome",
            nb_txn.clone(),
        );
        registry.register("nb_ops", "Northbound operations committed", nb_ops.clone());
        registry.register(
            "queue_depth",
            "Keys waiting in a work queue",
            queue_depth.clone(),
        );
        registry.register(
            "ipam_using_ips",
            "Addresses in use per subnet and family",
            ipam_using.clone(),
        );
        registry.register(
            "ipam_available_ips",
            "Addresses free per subnet and family",
            ipam_available.clone(),
        );
        registry.register(
            "handler_errors",
            "Handler failures per kind",
            handler_errors.clone(),
        );
        registry.register(
            "handler_panics",
            "Handler panics per kind (caught; the key is retried)",
            handler_panics.clone(),
        );
        let services = Gauge::default();
        let service_backends = Gauge::default();
        let service_programming = latency_histogram();
        registry.register(
            "services",
            "Services with load balancers in OVN",
            services.clone(),
        );
        registry.register(
            "service_backends",
            "Backends over every Service VIP",
            service_backends.clone(),
        );
        registry.register(
            "service_programming_seconds",
            "Time from a Service's run to its load balancers' change committed in NB",
            service_programming.clone(),
        );
        registry.register(
            "reconcile_seconds",
            "Reconciler run time per kind and outcome",
            reconcile.clone(),
        );
        Metrics(Arc::new(Inner {
            registry,
            pod_add,
            nb_txn,
            nb_ops,
            queue_depth,
            ipam_using,
            ipam_available,
            handler_errors,
            handler_panics,
            reconcile,
            services,
            service_backends,
            service_programming,
        }))
    }

    /// Records one pod add.
    pub fn pod_added(&self, d: Duration) {
        self.0.pod_add.observe(d.as_secs_f64());
    }

    /// Records one northbound transaction of `ops` operations.
    pub fn nb_transaction(&self, d: Duration, ops: usize, ok: bool) {
        let outcome = if ok { "ok" } else { "error" };
        self.0
            .nb_txn
            .get_or_create(&vec![("outcome", outcome.to_owned())])
            .observe(d.as_secs_f64());
        if ok {
            self.0.nb_ops.inc_by(ops as u64);
        }
    }

    /// Sets a queue's depth.
    pub fn queue_depth(&self, queue: &str, depth: usize) {
        self.0
            .queue_depth
            .get_or_create(&vec![("queue", queue.to_owned())])
            .set(depth as i64);
    }

    /// Sets a subnet's address usage for one family ("ipv4"/"ipv6").
    pub fn ipam_usage(&self, subnet: &str, family: &str, using: u128, available: u128) {
        let l = vec![("subnet", subnet.to_owned()), ("family", family.to_owned())];
        let clamp = |v: u128| i64::try_from(v).unwrap_or(i64::MAX);
        self.0.ipam_using.get_or_create(&l).set(clamp(using));
        self.0
            .ipam_available
            .get_or_create(&l)
            .set(clamp(available));
    }

    /// Counts a handler failure.
    pub fn handler_error(&self, kind: &str) {
        self.0
            .handler_errors
            .get_or_create(&vec![("kind", kind.to_owned())])
            .inc();
    }

    /// Records one reconciler run of `kind` (a failure is also counted in `handler_errors`).
    pub fn reconciled(&self, kind: &str, d: Duration, ok: bool) {
        self.reconcile_metrics(kind).observe(d, ok);
    }

    /// The run-time metrics of `kind`, resolved once: a worker pool records each run without building labels.
    pub fn reconcile_metrics(&self, kind: &str) -> ReconcileMetrics {
        let h = |outcome: &str| {
            self.0
                .reconcile
                .get_or_create(&vec![
                    ("kind", kind.to_owned()),
                    ("outcome", outcome.to_owned()),
                ])
                .clone()
        };
        ReconcileMetrics {
            ok: h("ok"),
            error: h("error"),
            errors: self
                .0
                .handler_errors
                .get_or_create(&vec![("kind", kind.to_owned())])
                .clone(),
        }
    }

    /// Sets the number of Services with load balancers and of their backends.
    pub fn services(&self, services: usize, backends: usize) {
        let clamp = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
        self.0.services.set(clamp(services));
        self.0.service_backends.set(clamp(backends));
    }

    /// Records one Service change programmed in NB.
    pub fn service_programmed(&self, d: Duration) {
        self.0.service_programming.observe(d.as_secs_f64());
    }

    /// Counts a handler panic.
    pub fn handler_panic(&self, kind: &str) {
        self.0
            .handler_panics
            .get_or_create(&vec![("kind", kind.to_owned())])
            .inc();
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut s = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.0.registry);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_every_family() {
        let m = Metrics::new();
        m.pod_added(Duration::from_millis(3));
        m.nb_transaction(Duration::from_millis(1), 7, true);
        m.queue_depth("pod", 4);
        m.ipam_usage("ovn-default", "ipv4", 3, 65530);
        m.handler_error("pod");
        m.handler_panic("pod");
        let subnet = m.reconcile_metrics("subnet");
        subnet.observe(Duration::from_millis(2), true);
        subnet.observe(Duration::from_millis(2), false);
        m.reconciled("subnet", Duration::from_millis(2), true);
        let t = m.encode();
        for want in [
            "kube_ovn_controller_pod_add_seconds_count 1",
            "kube_ovn_controller_nb_ops_total 7",
            "kube_ovn_controller_queue_depth{queue=\"pod\"} 4",
            "kube_ovn_controller_ipam_using_ips{subnet=\"ovn-default\",family=\"ipv4\"} 3",
            "kube_ovn_controller_handler_errors_total{kind=\"pod\"} 1",
            "kube_ovn_controller_handler_panics_total{kind=\"pod\"} 1",
            "kube_ovn_controller_reconcile_seconds_count{kind=\"subnet\",outcome=\"ok\"} 2",
            "kube_ovn_controller_reconcile_seconds_count{kind=\"subnet\",outcome=\"error\"} 1",
            "kube_ovn_controller_handler_errors_total{kind=\"subnet\"} 1",
        ] {
            assert!(t.contains(want), "{want} missing in\n{t}");
        }
    }
}
