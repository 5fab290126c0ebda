//! The crate's error type; API failures carry what a Kubernetes `Status` says.

use serde_json::{json, Value};

/// Everything that can fail in the server, from binding a socket to a request the API refuses.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A socket or file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The API refused a request; sent to the client as a `Status` object.
    #[error("{reason} ({code}): {message}")]
    Status {
        /// HTTP status code.
        code: u16,
        /// Kubernetes `StatusReason` (`NotFound`, `Conflict`, ...).
        reason: &'static str,
        /// Human-readable message.
        message: String,
        /// `details` of the Status (name, group, kind), if any.
        details: Option<Box<Value>>,
    },
    /// The server cannot start with this configuration (a bad `--service-cluster-ip-range`).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A kube client for the server could not be built.
    #[cfg(feature = "client")]
    #[error("building a kube client: {0}")]
    Client(#[source] Box<kube::Error>),
}

/// One field's fault in a 422 Invalid answer (a `StatusCause`), as kube-apiserver's validation
/// reports it: kubectl prints `field: message` for each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired`, ...
    pub reason: &'static str,
    /// The field's path (`spec.ports[0].port`).
    pub field: String,
    /// What is wrong, starting with the kind of fault (`Invalid value: 0: must be ...`).
    pub message: String,
}

impl Cause {
    /// `field: Invalid value: VALUE: detail` (VALUE already rendered as Go prints it).
    pub fn invalid(field: impl Into<String>, value: &str, detail: &str) -> Self {
        Cause {
            reason: "FieldValueInvalid",
            field: field.into(),
            message: format!("Invalid value: {value}: {detail}"),
        }
    }

    /// `field: Required value` (with a detail when given).
    pub fn required(field: impl Into<String>, detail: &str) -> Self {
        Cause {
            reason: "FieldValueRequired",
            field: field.into(),
            message: if detail.is_empty() {
                "Required value".to_owned()
            } else {
                format!("Required value: {detail}")
            },
        }
    }

    /// `field: Duplicate value: VALUE`.
    pub fn duplicate(field: impl Into<String>, value: &str) -> Self {
        Cause {
            reason: "FieldValueDuplicate",
            field: field.into(),
            message: format!("Duplicate value: {value}"),
        }
    }

    /// `field: Unsupported value: "v": supported values: "a", "b"`.
    pub fn unsupported(field: impl Into<String>, value: &str, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        Cause {
            reason: "FieldValueNotSupported",
            field: field.into(),
            message: format!(
                "Unsupported value: {value:?}: supported values: {}",
                list.join(", ")
            ),
        }
    }

    /// `field: Forbidden: detail`.
    pub fn forbidden(field: impl Into<String>, detail: &str) -> Self {
        Cause {
            reason: "FieldValueForbidden",
            field: field.into(),
            message: format!("Forbidden: {detail}"),
        }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Result with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    fn status(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Error::Status {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(self, d: Value) -> Self {
        match self {
            Error::Status {
                code,
                reason,
                message,
                ..
            } => Error::Status {
                code,
                reason,
                message,
                details: Some(Box::new(d)),
            },
            other => other,
        }
    }

    /// 404 for a named object.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let what = if group.is_empty() {
            plural.to_owned()
        } else {
            format!("{plural}.{group}")
        };
        Self::status(404, "NotFound", format!("{what} \"{name}\" not found"))
            .with_details(json!({"name": name, "group": group, "kind": plural}))
    }

    /// 404 for a path that names no served resource.
    pub fn no_resource() -> Self {
        Self::status(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// 409 AlreadyExists.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let what = if group.is_empty() {
            plural.to_owned()
        } else {
            format!("{plural}.{group}")
        };
        Self::status(
            409,
            "AlreadyExists",
            format!("{what} \"{name}\" already exists"),
        )
        .with_details(json!({"name": name, "group": group, "kind": plural}))
    }

    /// 409 Conflict on a stale resourceVersion.
    pub fn conflict(group: &str, plural: &str, name: &str) -> Self {
        let what = if group.is_empty() {
            plural.to_owned()
        } else {
            format!("{plural}.{group}")
        };
        Self::status(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {what} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again"
            ),
        )
        .with_details(json!({"name": name, "group": group, "kind": plural}))
    }

    /// 422 Invalid.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::status(422, "Invalid", message)
    }

    /// 422 Invalid for the object `name` of `kind`, with one cause per faulty field, as
    /// kube-apiserver answers (`Service "web" is invalid: spec.ports[0].port: ...`).
    pub fn invalid_object(kind: &str, name: &str, causes: &[Cause]) -> Self {
        let all: Vec<String> = causes.iter().map(Cause::to_string).collect();
        let text = match all.as_slice() {
            [one] => one.clone(),
            _ => format!("[{}]", all.join(", ")),
        };
        let causes: Vec<Value> = causes
            .iter()
            .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
            .collect();
        Self::status(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {text}"),
        )
        .with_details(json!({"name": name, "group": "", "kind": kind, "causes": causes}))
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::status(400, "BadRequest", message)
    }

    /// 410 Gone (a watch from a compacted resourceVersion).
    pub fn gone(message: impl Into<String>) -> Self {
        Self::status(410, "Expired", message)
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed() -> Self {
        Self::status(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media(ct: &str) -> Self {
        Self::status(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format: {ct}"),
        )
    }

    /// 413 RequestEntityTooLarge.
    pub fn too_large(limit: usize) -> Self {
        Self::status(
            413,
            "RequestEntityTooLarge",
            format!("the request body is larger than {limit} bytes"),
        )
    }

    /// 503 ServiceUnavailable.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::status(503, "ServiceUnavailable", message)
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::status(500, "InternalError", message)
    }

    /// HTTP code to answer with.
    pub fn code(&self) -> u16 {
        match self {
            Error::Status { code, .. } => *code,
            _ => 500,
        }
    }

    /// The `Status` object for this error, as kube-client and kubectl parse it.
    pub fn to_status(&self) -> Value {
        let (code, reason, message, details) = match self {
            Error::Status {
                code,
                reason,
                message,
                details,
            } => (*code, *reason, message.clone(), details.as_deref().cloned()),
            _ => (500, "InternalError", self.to_string(), None),
        };
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        });
        if let Some(d) = details {
            s["details"] = d;
        }
        s
    }
}
