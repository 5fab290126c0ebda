//! The connection task against scripted fake servers (no OVS needed): pipelined requests answered out of
//! order and one byte at a time, the server's echo answered, the inactivity probe, a server that hangs up.

use std::time::{Duration, Instant};

use kubeovn_ovn::framing::{encode_response, FrameDecoder, Message};
use kubeovn_ovn::serde_json::{json, Value};
use kubeovn_ovn::{Client, Error};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

fn listener() -> (tempfile::TempDir, UnixListener, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("fake.sock");
    let l = UnixListener::bind(&path).expect("bind");
    (dir, l, format!("unix:{}", path.display()))
}

async fn read_messages(s: &mut UnixStream, d: &mut FrameDecoder, n: usize) -> Vec<Message> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while out.len() < n {
        while let Some(m) = d.next_message().expect("decode") {
            out.push(m);
        }
        if out.len() >= n {
            break;
        }
        let k = s.read(&mut buf).await.expect("read");
        assert!(k > 0, "client closed early");
        d.feed(&buf[..k]);
    }
    out
}

#[tokio::test]
async fn pipelined_requests_answered_out_of_order_in_one_byte_writes() {
    let (_dir, l, remote) = listener();
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.expect("accept");
        let mut d = FrameDecoder::new();
        let reqs = read_messages(&mut s, &mut d, 3).await;
        let mut out = Vec::new();
        // An echo request from the server first, then the answers in reverse order.
        Message::Request {
            id: json!("echo"),
            method: "echo".into(),
            params: json!(["x"]),
        }
        .encode(&mut out);
        for m in reqs.iter().rev() {
            let Message::Request { id, method, params } = m else {
                panic!("{m:?}")
            };
            encode_response(&mut out, id, &json!({"method": method, "params": params}));
        }
        for b in out {
            s.write_all(&[b]).await.expect("write");
        }
        let echo_reply = read_messages(&mut s, &mut d, 1).await;
        assert_eq!(
            echo_reply,
            vec![Message::Response {
                id: json!("echo"),
                result: Ok(json!(["x"]))
            }]
        );
    });
    let c = Client::connect(&remote).await.expect("connect");
    let futs: Vec<_> = (0..3).map(|i| c.call("m", &[i])).collect();
    for (i, f) in futs.into_iter().enumerate() {
        let r: Value = f.await.expect("reply");
        assert_eq!(r, json!({"method": "m", "params": [i]}));
    }
    server.await.expect("server");
}

#[tokio::test]
async fn the_inactivity_probe_gives_up_on_a_silent_server() {
    let (_dir, l, remote) = listener();
    let _server = tokio::spawn(async move {
        let (s, _) = l.accept().await.expect("accept");
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(s);
    });
    let c = Client::builder()
        .inactivity_probe(Some(Duration::from_millis(50)))
        .connect(&remote)
        .await
        .expect("connect");
    let t0 = Instant::now();
    let e = c.list_dbs().await.unwrap_err();
    let dt = t0.elapsed();
    assert!(
        matches!(&e, Error::Disconnected(why) if why.contains("inactivity probe")),
        "{e:?}"
    );
    assert!(
        dt >= Duration::from_millis(90) && dt < Duration::from_secs(2),
        "{dt:?}"
    );
    // The connection is gone: later calls fail at once.
    assert!(matches!(c.echo().await, Err(Error::Disconnected(_))));
}

#[tokio::test]
async fn a_server_that_hangs_up_fails_the_requests_in_flight() {
    let (_dir, l, remote) = listener();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.expect("accept");
        let mut d = FrameDecoder::new();
        read_messages(&mut s, &mut d, 2).await;
        drop(s);
    });
    let c = Client::connect(&remote).await.expect("connect");
    let a = c.call("a", &[(); 0]);
    let b = c.call("b", &[(); 0]);
    for f in [a, b] {
        let e = f.await.unwrap_err();
        assert!(
            matches!(&e, Error::Disconnected(why) if why.contains("closed by the server")),
            "{e:?}"
        );
    }
}

#[tokio::test]
async fn connecting_to_nothing_is_an_io_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let e = Client::connect(&format!("unix:{}", dir.path().join("none.sock").display()))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
    // The first reachable remote of a list is used.
    let (_d2, l, remote) = listener();
    tokio::spawn(async move {
        let _ = l.accept().await;
        tokio::time::sleep(Duration::from_secs(5)).await;
    });
    let list = format!("unix:{},{remote}", dir.path().join("none.sock").display());
    let c = Client::connect(&list).await.expect("second remote");
    assert_eq!(c.remote(), remote);
}
