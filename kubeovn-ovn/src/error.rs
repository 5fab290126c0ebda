//! The crate's error type: one enum wrapping the small per-module errors.

use crate::conn::ProbeTimeout;
use crate::datum::DatumError;
use crate::framing::DecodeError;
use crate::model::ModelError;
use crate::monitor::UpdateError;
use crate::northbound::NbError;
use crate::ops::{OvsdbError, ResultError, TransactError, ValidationError};
use crate::schema::SchemaError;
use crate::vswitch::OvsError;

/// Any error of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A remote string that is not `unix:PATH` or `tcp:HOST:PORT`.
    #[error("invalid remote {remote:?}: {why}")]
    InvalidRemote {
        /// The remote given.
        remote: String,
        /// Why it is not usable.
        why: &'static str,
    },
    /// Connecting or reading/writing the socket failed.
    #[error("I/O error on {remote}: {source}")]
    Io {
        /// The remote.
        remote: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// TLS configuration or the TLS handshake failed (`ssl:` remotes): unreadable PEM files, a server
    /// certificate the CA did not sign or not valid for the name, a client certificate the server refused.
    #[error("TLS error on {remote}: {what}")]
    Tls {
        /// The remote (empty while reading the configuration).
        remote: String,
        /// What failed.
        what: String,
        /// The cause, when there is one (a `rustls::Error` for handshake failures).
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The connection is closed (by the server, an error or the inactivity probe); the request may or may
    /// not have been executed.
    #[error("connection closed: {0}")]
    Disconnected(String),
    /// The connection died after a transaction was handed to it and before its reply arrived: the server may or
    /// may not have committed it. Read the database (or the replica, once it has resynchronised) to find out.
    #[error("transaction outcome unknown: connection closed before the reply ({0})")]
    OutcomeUnknown(String),
    /// A clustered database member that is not the leader (or not connected to its cluster), refused because
    /// the session is leader-only.
    #[error("{remote} is not the leader of {db}")]
    NotLeader {
        /// The member.
        remote: String,
        /// The database.
        db: String,
    },
    /// The inactivity probe gave up.
    #[error(transparent)]
    Probe(#[from] ProbeTimeout),
    /// The byte stream from the server could not be decoded.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// A schema could not be parsed.
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// A datum is invalid.
    #[error(transparent)]
    Datum(#[from] DatumError),
    /// A transaction or monitor request was rejected before being sent.
    #[error(transparent)]
    Validation(#[from] ValidationError),
    /// The server executed the transaction and it failed.
    #[error(transparent)]
    Transact(#[from] TransactError),
    /// The server answered a method call with an error.
    #[error("{method} failed: {error}")]
    Rpc {
        /// The method called.
        method: &'static str,
        /// The server's error and details.
        error: OvsdbError,
    },
    /// An update notification could not be read.
    #[error(transparent)]
    Update(#[from] UpdateError),
    /// The server's reply was not shaped as the method defines.
    #[error("unexpected reply to {method}: {what}")]
    Protocol {
        /// The method called.
        method: &'static str,
        /// What was wrong.
        what: String,
    },
    /// A row did not fit its model.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The northbound API refused a request or could not confirm it (a row not found or already there, the
    /// replica late).
    #[error(transparent)]
    Nb(#[from] NbError),
    /// The Open_vSwitch API refused a request or a wait did not complete.
    #[error(transparent)]
    Ovs(#[from] OvsError),
    /// Encoding a request failed.
    #[error("encoding a request: {0}")]
    Encode(#[from] serde_json::Error),
}

impl Error {
    /// Whether the error says the connection is gone (the request was not executed, or its outcome is unknown):
    /// a reconnect may help.
    pub fn is_connection_error(&self) -> bool {
        matches!(
            self,
            Error::Io { .. }
                | Error::Disconnected(_)
                | Error::OutcomeUnknown(_)
                | Error::Probe(_)
                | Error::NotLeader { .. }
        )
    }

    /// Whether a row the request needed does not exist ([`NbError::NotFound`], [`OvsError::NotFound`]).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            Error::Nb(NbError::NotFound { .. }) | Error::Ovs(OvsError::NotFound { .. })
        )
    }

    /// Whether a row exists where the request said it must not ([`NbError::Exists`]).
    pub fn is_exists(&self) -> bool {
        matches!(self, Error::Nb(NbError::Exists { .. }))
    }

    /// Whether a wait gave up: the replica did not show a committed change in time
    /// ([`NbError::CacheTimeout`]), or an Open_vSwitch wait ([`OvsError::Timeout`]). The change may be in.
    pub fn is_timeout(&self) -> bool {
        matches!(
            self,
            Error::Nb(NbError::CacheTimeout(_)) | Error::Ovs(OvsError::Timeout(..))
        )
    }

    /// The rustls error behind a failed TLS handshake, e.g. `InvalidCertificate(UnknownIssuer)` when the
    /// server's certificate was not signed by the configured CA.
    #[cfg(feature = "ssl")]
    pub fn tls_error(&self) -> Option<&rustls::Error> {
        match self {
            Error::Tls {
                source: Some(s), ..
            } => s.downcast_ref::<rustls::Error>(),
            _ => None,
        }
    }

    /// The server's error, for a failed transaction or method call.
    pub fn ovsdb_error(&self) -> Option<&OvsdbError> {
        match self {
            Error::Transact(t) => Some(&t.error),
            Error::Rpc { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl From<ResultError> for Error {
    fn from(e: ResultError) -> Self {
        match e {
            ResultError::Failed(t) => Error::Transact(t),
            ResultError::Malformed(what) => Error::Protocol {
                method: "transact",
                what,
            },
        }
    }
}
