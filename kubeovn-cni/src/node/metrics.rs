//! Prometheus metrics: CNI request latency by command, errors by command and code.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CommandLabels {
    command: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    command: String,
    code: String,
}

fn latency_histogram() -> Histogram {
    // 250 µs to ~8 s.
    Histogram::new(exponential_buckets(0.000_25, 2.0, 16))
}

/// The daemon's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    latency: Family<CommandLabels, Histogram, fn() -> Histogram>,
    errors: Family<ErrorLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// `kube_ovn_cni_request_duration_seconds{command}` and `kube_ovn_cni_errors_total{command,code}`.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let latency = Family::<CommandLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "kube_ovn_cni_request_duration_seconds",
            "Time the daemon took to handle a CNI request, by command",
            latency.clone(),
        );
        registry.register(
            "kube_ovn_cni_errors",
            "CNI requests that failed, by command and CNI error code",
            errors.clone(),
        );
        Metrics {
            registry,
            latency,
            errors,
        }
    }

    /// Records one handled request: its duration, and its error code if it failed.
    pub fn observe(&self, command: &str, took: Duration, error_code: Option<u32>) {
        self.latency
            .get_or_create(&CommandLabels {
                command: command.to_owned(),
            })
            .observe(took.as_secs_f64());
        if let Some(code) = error_code {
            self.errors
                .get_or_create(&ErrorLabels {
                    command: command.to_owned(),
                    code: code.to_string(),
                })
                .inc();
        }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition() {
        let m = Metrics::new();
        m.observe("ADD", Duration::from_millis(2), None);
        m.observe("ADD", Duration::from_millis(3), Some(11));
        m.observe("DEL", Duration::from_micros(100), None);
        let t = m.encode();
        assert!(
            t.contains("kube_ovn_cni_request_duration_seconds_count{command=\"ADD\"} 2"),
            "{t}"
        );
        assert!(
            t.contains("kube_ovn_cni_errors_total{command=\"ADD\",code=\"11\"} 1"),
            "{t}"
        );
        assert!(t.ends_with("# EOF\n"));
    }
}
