//! The `ssl:` transport against a real ovsdb-server (`--remote=pssl:`), certificates made by `ovs-pki`.

#![cfg(feature = "ssl")]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use kubeovn_ovn::ops::{Operation, Transaction};
use kubeovn_ovn::{Client, Error, TlsConfig};

/// Our ovsdb-server child, killed by pid when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `ovs-pki init` in `dir` and one `switch` certificate per name; returns the CA certificate path.
fn pki(dir: &Path, names: &[&str]) -> PathBuf {
    let pki = dir.join("pki");
    let run = |args: &[&str]| {
        let out = Command::new("ovs-pki")
            .arg(format!("--dir={}", pki.display()))
            .arg("--force")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("ovs-pki");
        assert!(
            out.status.success(),
            "ovs-pki {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["init"]);
    for n in names {
        run(&["req+sign", n, "switch"]);
    }
    pki.join("switchca").join("cacert.pem")
}

struct Setup {
    _dir: tempfile::TempDir,
    _server: Server,
    remote: String,
    ca: PathBuf,
    other_ca: PathBuf,
    key: PathBuf,
    cert: PathBuf,
}

fn setup() -> Option<Setup> {
    if !common::have("ovsdb-server") || !common::have("ovsdb-tool") || !common::have("ovs-pki") {
        return None;
    }
    let dir = tempfile::Builder::new()
        .prefix("kubeovn-ovn-ssl")
        .tempdir()
        .expect("tempdir");
    let d = dir.path();
    let ca = pki(d, &["server", "client"]);
    let other = d.join("other");
    std::fs::create_dir(&other).expect("mkdir");
    let other_ca = pki(&other, &[]);
    let db = d.join("nb.db");
    let out = Command::new("ovsdb-tool")
        .arg("create")
        .arg(&db)
        .arg(common::schema_path("ovn-nb.ovsschema"))
        .output()
        .expect("ovsdb-tool");
    assert!(out.status.success());
    let port = common::free_port();
    let extra = [
        format!("--remote=pssl:{port}:127.0.0.1"),
        format!("--private-key={}", d.join("server-privkey.pem").display()),
        format!("--certificate={}", d.join("server-cert.pem").display()),
        format!("--ca-cert={}", ca.display()),
    ];
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let server = Server(common::spawn_server(
        d,
        &d.join("db.sock"),
        None,
        &db,
        &extra,
    ));
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "ovsdb-server did not listen on {port}: {}",
            std::fs::read_to_string(d.join("ovsdb-server.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Some(Setup {
        remote: format!("ssl:127.0.0.1:{port}"),
        key: d.join("client-privkey.pem"),
        cert: d.join("client-cert.pem"),
        ca,
        other_ca,
        _server: server,
        _dir: dir,
    })
}

#[tokio::test]
async fn ssl_list_dbs_and_transact() {
    let Some(s) = setup() else { return };
    // ovs-pki certificates carry no SAN for 127.0.0.1: verify the chain only.
    let tls = TlsConfig::from_pem_files(&s.key, &s.cert, &s.ca)
        .unwrap()
        .verify_server_name(false);
    let c = Client::builder().tls(tls).connect(&s.remote).await.unwrap();
    assert_eq!(c.remote(), s.remote);
    let dbs = c.list_dbs().await.unwrap();
    assert!(dbs.contains(&"OVN_Northbound".to_owned()), "{dbs:?}");
    c.get_schema("OVN_Northbound").await.unwrap();
    // Many transactions in flight, so that writes are larger than one TLS record.
    let txns: Vec<Transaction> = (0..200)
        .map(|i| {
            Transaction::new("OVN_Northbound").op(Operation::insert("Logical_Switch")
                .value("name", format!("ls{i}"))
                .value(
                    "external_ids",
                    kubeovn_ovn::Datum::map([("k".to_owned(), "x".repeat(500))]),
                ))
        })
        .collect();
    let futs: Vec<_> = txns.iter().map(|t| c.transact(t)).collect();
    for f in futs {
        let r = f.await.unwrap();
        assert!(r[0].uuid().is_some());
    }
    let got = c
        .call(
            "transact",
            &serde_json::json!(["OVN_Northbound", {"op": "select", "table": "Logical_Switch", "where": [], "columns": ["name"]}]),
        )
        .await
        .unwrap();
    assert_eq!(got[0]["rows"].as_array().unwrap().len(), 200);
}

#[tokio::test]
async fn ssl_errors_are_typed() {
    let Some(s) = setup() else { return };
    // A CA that did not sign the server's certificate.
    let tls = TlsConfig::from_pem_files(&s.key, &s.cert, &s.other_ca)
        .unwrap()
        .verify_server_name(false);
    let e = Client::builder()
        .tls(tls)
        .connect(&s.remote)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Tls { .. }), "{e:?}");
    // Both PKIs come from ovs-pki with the same CA name, so the chain may be rejected as signed by an
    // unknown issuer or, when the other CA's name matches, by a bad signature: either way not trusted.
    assert!(
        matches!(
            e.tls_error(),
            Some(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer | rustls::CertificateError::BadSignature
            ))
        ),
        "{e:?}"
    );
    // Name verification on (the default): the ovs-pki certificate is not valid for 127.0.0.1.
    let tls = TlsConfig::from_pem_files(&s.key, &s.cert, &s.ca).unwrap();
    let e = Client::builder()
        .tls(tls)
        .connect(&s.remote)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e.tls_error(),
            Some(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                    | rustls::CertificateError::NotValidForNameContext { .. }
            ))
        ),
        "{e:?}"
    );
    // No TLS configuration at all.
    let e = Client::connect(&s.remote).await.unwrap_err();
    assert!(matches!(e, Error::Tls { .. }), "{e:?}");
    // A missing file.
    let e = TlsConfig::from_pem_files("/nonexistent/key.pem", &s.cert, &s.ca).unwrap_err();
    assert!(matches!(e, Error::Tls { .. }), "{e:?}");
}
