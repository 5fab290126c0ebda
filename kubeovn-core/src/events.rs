//! Kubernetes Events behind a trait, so handlers report problems (a bad annotation, an address conflict) as
//! a Warning on the object without depending on a live API server in tests.

use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};

use crate::error::AnnotationError;

/// Reason of the Warning published for a malformed annotation.
pub const REASON_INVALID_ANNOTATION: &str = "InvalidAnnotation";
/// Action of the Warning published for a malformed annotation.
pub const ACTION_PARSE_ANNOTATIONS: &str = "ParseAnnotations";
/// The longest note the events API accepts (1 kB).
const MAX_NOTE: usize = 1024;

/// Publishes Events about objects; [`Recorder`] is the real implementation.
#[async_trait::async_trait]
pub trait EventSink: Send + Sync {
    /// Publishes `event` about the object `regarding`.
    async fn publish(&self, event: &Event, regarding: &ObjectReference) -> Result<(), kube::Error>;
}

#[async_trait::async_trait]
impl EventSink for Recorder {
    async fn publish(&self, event: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        Recorder::publish(self, event, regarding).await
    }
}

/// A Warning event; the note is cut to the 1 kB the events API accepts.
pub fn warning(reason: &str, action: &str, note: &str) -> Event {
    Event {
        type_: EventType::Warning,
        reason: reason.to_owned(),
        note: Some(cut(note, MAX_NOTE)),
        action: action.to_owned(),
        secondary: None,
    }
}

/// The Warning for a malformed annotation: reason `InvalidAnnotation`, the error (key, value, problem) as
/// the note.
pub fn bad_annotation(err: &AnnotationError) -> Event {
    warning(
        REASON_INVALID_ANNOTATION,
        ACTION_PARSE_ANNOTATIONS,
        &err.to_string(),
    )
}

/// Publishes the Warning for `err` on `regarding`.
pub async fn warn_bad_annotation(
    sink: &dyn EventSink,
    regarding: &ObjectReference,
    err: &AnnotationError,
) -> Result<(), kube::Error> {
    sink.publish(&bad_annotation(err), regarding).await
}

fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max - 3;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// An event as [`RecordingSink`] keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedEvent {
    /// Warning or not.
    pub warning: bool,
    /// Reason.
    pub reason: String,
    /// Action.
    pub action: String,
    /// Note.
    pub note: Option<String>,
    /// The object it is about.
    pub regarding: ObjectReference,
}

/// An [`EventSink`] that keeps what is published, for tests and for embedding without an API server.
#[derive(Debug, Default)]
pub struct RecordingSink {
    events: Mutex<Vec<RecordedEvent>>,
}

impl RecordingSink {
    /// An empty sink.
    pub fn new() -> Self {
        Self::default()
    }

    /// The events published so far.
    pub fn events(&self) -> Vec<RecordedEvent> {
        self.events
            .lock()
            .map(|e| e.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }
}

#[async_trait::async_trait]
impl EventSink for RecordingSink {
    async fn publish(&self, event: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let rec = RecordedEvent {
            warning: event.type_ == EventType::Warning,
            reason: event.reason.clone(),
            action: event.action.clone(),
            note: event.note.clone(),
            regarding: regarding.clone(),
        };
        match self.events.lock() {
            Ok(mut e) => e.push(rec),
            Err(p) => p.into_inner().push(rec),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::annotations::{PodNetworkAnnotations, IP_ADDRESS};

    #[tokio::test]
    async fn bad_annotation_becomes_a_warning() {
        let anns = BTreeMap::from([(IP_ADDRESS.to_owned(), "10.16.0.999".to_owned())]);
        let err = PodNetworkAnnotations::parse(&anns, "ovn").expect_err("bad address");
        let pod = ObjectReference {
            kind: Some("Pod".into()),
            namespace: Some("default".into()),
            name: Some("web-0".into()),
            ..Default::default()
        };
        let sink = RecordingSink::new();
        warn_bad_annotation(&sink, &pod, &err)
            .await
            .expect("recorded");
        let ev = &sink.events()[0];
        assert!(ev.warning);
        assert_eq!(ev.reason, "InvalidAnnotation");
        let note = ev.note.as_deref().unwrap_or_default();
        assert!(
            note.contains(IP_ADDRESS) && note.contains("10.16.0.999"),
            "{note}"
        );
        assert_eq!(ev.regarding, pod);
    }

    #[test]
    fn notes_fit_the_events_api() {
        let long = "é".repeat(2000);
        let ev = warning("R", "A", &long);
        let note = ev.note.expect("note");
        assert!(note.len() <= MAX_NOTE && note.ends_with("..."));
    }
}
