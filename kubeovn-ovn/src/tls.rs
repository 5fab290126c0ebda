//! TLS settings for `ssl:HOST:PORT` remotes (feature `ssl`): rustls with the ring provider.
//!
//! ovsdb-server with `--remote=pssl:...` asks every client for a certificate signed by its `--ca-cert`, so
//! a [`TlsConfig`] holds the client's certificate chain and private key and the CA that signed the server's
//! certificate, all read from PEM files (the files `ovs-pki` writes, or `/etc/ovn/ovnnb-*.pem` in Kube-OVN).
//!
//! ## Server name verification
//!
//! By default the server's certificate must chain to the CA **and** be valid for the remote's host: rustls
//! (webpki) only looks at the subject alternative names, never at the common name, and an IP address host
//! must appear as an IP address SAN. Certificates made by `ovs-pki` carry only a DNS SAN like
//! `"ovnnb id:<uuid>"` and no IP address, so they never match `ssl:127.0.0.1:6641`. For those, either set
//! the name that the certificate does carry with [`TlsConfig::server_name`], or use
//! [`TlsConfig::verify_server_name`]`(false)`: the chain, validity dates and signatures are still checked
//! against the CA, only the name match is skipped (any certificate the CA signed is accepted, as with
//! the C client, which does not check names either).

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::error::Error;

/// Certificates and verification policy for `ssl:` remotes; set with
/// [`ClientBuilder::tls`](crate::client::ClientBuilder::tls). Cheap to clone.
#[derive(Clone)]
pub struct TlsConfig {
    roots: Arc<RootCertStore>,
    certs: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
    server_name: Option<String>,
    verify_name: bool,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("ca_certs", &self.roots.len())
            .field("client_certs", &self.certs.len())
            .field("server_name", &self.server_name)
            .field("verify_name", &self.verify_name)
            .finish_non_exhaustive()
    }
}

fn tls_err(what: String) -> Error {
    Error::Tls {
        remote: String::new(),
        what,
        source: None,
    }
}

impl TlsConfig {
    /// Reads the client's private key and certificate (chain) and the CA certificate(s) from PEM files, as
    /// ovn-nbctl's `--private-key`, `--certificate` and `--ca-cert`.
    pub fn from_pem_files(
        private_key: impl AsRef<Path>,
        certificate: impl AsRef<Path>,
        ca_cert: impl AsRef<Path>,
    ) -> Result<TlsConfig, Error> {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|e| tls_err(format!("reading {}: {e}", p.display())))
        };
        Self::from_pem(
            &read(private_key.as_ref())?,
            &read(certificate.as_ref())?,
            &read(ca_cert.as_ref())?,
        )
    }

    /// Like [`TlsConfig::from_pem_files`], from PEM text in memory.
    pub fn from_pem(
        private_key: &[u8],
        certificate: &[u8],
        ca_cert: &[u8],
    ) -> Result<TlsConfig, Error> {
        let key = PrivateKeyDer::from_pem_slice(private_key)
            .map_err(|e| tls_err(format!("private key: {e}")))?;
        let certs = CertificateDer::pem_slice_iter(certificate)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| tls_err(format!("certificate: {e}")))?;
        if certs.is_empty() {
            return Err(tls_err("certificate: no CERTIFICATE in the PEM".into()));
        }
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(ca_cert) {
            let ca = ca.map_err(|e| tls_err(format!("CA certificate: {e}")))?;
            roots
                .add(ca)
                .map_err(|e| tls_err(format!("CA certificate: {e}")))?;
        }
        if roots.is_empty() {
            return Err(tls_err("CA certificate: no CERTIFICATE in the PEM".into()));
        }
        Ok(TlsConfig {
            roots: Arc::new(roots),
            certs,
            key: Arc::new(key),
            server_name: None,
            verify_name: true,
        })
    }

    /// The name to verify the server's certificate against (and to send as SNI) instead of the remote's host.
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// Whether the server's certificate must be valid for the host name (default true). With false, only
    /// the chain to the CA (signatures, dates, key usage) is verified: see the module documentation.
    pub fn verify_server_name(mut self, verify: bool) -> Self {
        self.verify_name = verify;
        self
    }

    /// The rustls configuration and the server name for a connection to `host`.
    pub(crate) fn client_config(
        &self,
        host: &str,
    ) -> Result<(Arc<rustls::ClientConfig>, ServerName<'static>), Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let webpki =
            WebPkiServerVerifier::builder_with_provider(self.roots.clone(), provider.clone())
                .build()
                .map_err(|e| tls_err(format!("CA certificate: {e}")))?;
        let verifier: Arc<dyn ServerCertVerifier> = if self.verify_name {
            webpki
        } else {
            Arc::new(ChainOnly(webpki))
        };
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_auth_cert(self.certs.clone(), self.key.clone_key())
            .map_err(|e| tls_err(format!("client certificate or key: {e}")))?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let name = self.server_name.as_deref().unwrap_or(host);
        let name = ServerName::try_from(name.to_owned())
            .map_err(|e| tls_err(format!("server name {name:?}: {e}")))?;
        Ok((Arc::new(config), name))
    }
}

/// Verifies the chain with webpki and accepts a certificate that is not valid for the server name.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // webpki checks the chain before the name: a name error means the chain was good.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            r => r,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
