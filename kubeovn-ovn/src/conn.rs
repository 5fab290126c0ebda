//! The connection state machine without I/O: request ids, requests in flight, matching responses, answering
//! the server's `echo`, routing notifications, and the inactivity probe.
//!
//! Time is passed in (`now`), never read, so tests drive it deterministically. The driver feeds received bytes
//! ([`Connection::read_buffer`] then [`Connection::handle_input`]), writes what [`Connection::take_output`]
//! hands it, calls [`Connection::handle_timeout`] at [`Connection::poll_timeout`], and takes
//! [`Event`]s from [`Connection::poll_event`].

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value as Json;

use serde_json::value::RawValue;

use crate::framing::{
    encode_error_response, encode_response, DecodeError, FrameDecoder, RawMessage,
};
use crate::ops::OvsdbError;
use crate::uuid::Uuid;

/// Which update notification format a monitor uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateKind {
    /// `update` (from `monitor`): `{"old": row, "new": row}`.
    Update,
    /// `update2` (from `monitor_cond`): `initial`/`insert`/`delete`/`modify`.
    Update2,
    /// `update3` (from `monitor_cond_since`): like update2 with the last transaction id.
    Update3,
}

/// A notification from the server.
#[derive(Debug, Clone)]
pub enum Notification {
    /// `update`, `update2` or `update3` for one monitor.
    Update {
        /// The monitor's id (the json-value given to the monitor request).
        monitor: Json,
        /// The notification format.
        kind: UpdateKind,
        /// For update3: the id of the transaction these changes complete.
        last_txn_id: Option<Uuid>,
        /// The `<table-updates>` or `<table-updates2>` object, as JSON text (see
        /// [`crate::monitor::parse_table_updates_str`]).
        updates: Box<RawValue>,
    },
    /// `locked`: a lock requested earlier is now held.
    Locked(String),
    /// `stolen`: a held lock was taken by another client's `steal`.
    Stolen(String),
    /// Any other notification.
    Other {
        /// Method.
        method: String,
        /// Parameters.
        params: Json,
    },
}

/// Something the driver must act on.
#[derive(Debug)]
pub enum Event<T> {
    /// The response to the request registered with `token`.
    Reply {
        /// What the caller registered.
        token: T,
        /// The result as JSON text, or the server's error.
        result: Result<Box<RawValue>, OvsdbError>,
    },
    /// A notification.
    Notification(Notification),
}

/// The inactivity probe gave up: nothing was received for two intervals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no message from the server for {0:?} (inactivity probe)")]
pub struct ProbeTimeout(pub Duration);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProbeState {
    /// Waiting for traffic; probe at `last_rx + interval`.
    Active,
    /// Echo sent at `since`; give up at `since + interval`.
    Idle { since: Instant },
}

/// Counters of a connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests sent.
    pub requests: u64,
    /// Responses matched to a request.
    pub replies: u64,
    /// Responses with an id no request had (ignored).
    pub unmatched: u64,
    /// Echo requests from the server answered.
    pub echoes_answered: u64,
    /// Probe echoes sent.
    pub probes_sent: u64,
    /// Notifications received.
    pub notifications: u64,
    /// Frames that were not valid JSON-RPC (ignored).
    pub bad_messages: u64,
}

/// One OVSDB connection's protocol state, generic over the caller's per-request token.
#[derive(Debug)]
pub struct Connection<T> {
    next_id: u64,
    pending: HashMap<u64, Option<T>>,
    decoder: FrameDecoder,
    out: Vec<u8>,
    events: VecDeque<Event<T>>,
    probe_interval: Option<Duration>,
    probe: ProbeState,
    last_rx: Instant,
    stats: Stats,
}

impl<T> Connection<T> {
    /// A new connection at time `now`; `probe_interval` None disables the inactivity probe.
    pub fn new(now: Instant, probe_interval: Option<Duration>) -> Self {
        Self::with_decoder(now, probe_interval, FrameDecoder::new())
    }

    /// A new connection with a given decoder (for a different message size limit).
    pub fn with_decoder(
        now: Instant,
        probe_interval: Option<Duration>,
        decoder: FrameDecoder,
    ) -> Self {
        Connection {
            next_id: 1,
            pending: HashMap::new(),
            decoder,
            out: Vec::with_capacity(64 * 1024),
            events: VecDeque::new(),
            probe_interval,
            probe: ProbeState::Active,
            last_rx: now,
            stats: Stats::default(),
        }
    }

    /// Queues a request; the response comes back as [`Event::Reply`] with `token`. Returns the request id.
    pub fn send_request<P: Serialize + ?Sized>(
        &mut self,
        method: &str,
        params: &P,
        token: T,
    ) -> Result<u64, serde_json::Error> {
        let id = self.next_id;
        crate::framing::encode_request(&mut self.out, id, method, params)?;
        self.register(id, token);
        Ok(id)
    }

    /// Queues a request whose params (a JSON array) are already encoded, e.g. by the caller's task.
    pub fn send_request_encoded(&mut self, method: &str, params_json: &[u8], token: T) -> u64 {
        let id = self.next_id;
        self.out.extend_from_slice(b"{\"method\":");
        // A method name is a plain identifier; serde_json quotes it (cannot fail for a &str into a Vec).
        let _ = serde_json::to_writer(&mut self.out, method);
        self.out.extend_from_slice(b",\"params\":");
        self.out.extend_from_slice(params_json);
        self.out.extend_from_slice(b",\"id\":");
        let _ = serde_json::to_writer(&mut self.out, &id);
        self.out.push(b'}');
        self.register(id, token);
        id
    }

    fn register(&mut self, id: u64, token: T) {
        self.next_id += 1;
        self.pending.insert(id, Some(token));
        self.stats.requests += 1;
    }

    /// Queues a notification (a message with a null id, e.g. `cancel`).
    pub fn send_notification<P: Serialize + ?Sized>(
        &mut self,
        method: &str,
        params: &P,
    ) -> Result<(), serde_json::Error> {
        #[derive(Serialize)]
        struct N<'a, P: ?Sized> {
            method: &'a str,
            params: &'a P,
            id: (),
        }
        serde_json::to_writer(
            &mut self.out,
            &N {
                method,
                params,
                id: (),
            },
        )
    }

    /// Queues `cancel` for request `id` (the server answers the cancelled request with an error).
    pub fn cancel(&mut self, id: u64) {
        let _ = self.send_notification("cancel", &[id]);
    }

    /// Moves the bytes to send into `buf` (which should be empty); cheap: the buffers are swapped.
    pub fn take_output(&mut self, buf: &mut Vec<u8>) {
        if buf.is_empty() {
            std::mem::swap(buf, &mut self.out);
        } else {
            buf.append(&mut self.out);
        }
    }

    /// Whether there are bytes to send.
    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// The buffer to append received bytes to (then call [`Connection::handle_input`]).
    pub fn read_buffer(&mut self) -> &mut Vec<u8> {
        self.decoder.read_buffer(64 * 1024)
    }

    /// Appends received bytes and processes them.
    pub fn feed(&mut self, data: &[u8], now: Instant) -> Result<(), DecodeError> {
        self.decoder.feed(data);
        self.handle_input(now)
    }

    /// Processes the bytes received so far: queues events, answers echo. A fatal decode error means the
    /// connection must be closed.
    ///
    /// Payloads (results, update notifications) are kept as JSON text and decoded by their reader, which
    /// knows their shape: a monitor's rows are decoded straight from the text (see [`crate::decode`]).
    pub fn handle_input(&mut self, now: Instant) -> Result<(), DecodeError> {
        loop {
            let Connection {
                decoder,
                pending,
                out,
                events,
                stats,
                last_rx,
                probe,
                ..
            } = self;
            let ok = match decoder.next_raw_message() {
                Ok(Some(m)) => handle_message(m, pending, out, events, stats),
                Ok(None) => return Ok(()),
                Err(e) if e.is_fatal() => return Err(e),
                Err(_) => false,
            };
            if !ok {
                stats.bad_messages += 1;
            }
            *last_rx = now;
            *probe = ProbeState::Active;
        }
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event<T>> {
        self.events.pop_front()
    }

    /// When [`Connection::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let iv = self.probe_interval?;
        Some(match self.probe {
            ProbeState::Active => self.last_rx + iv,
            ProbeState::Idle { since } => since + iv,
        })
    }

    /// Advances the inactivity probe: sends an echo after one quiet interval, fails after two.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), ProbeTimeout> {
        let Some(iv) = self.probe_interval else {
            return Ok(());
        };
        match self.probe {
            ProbeState::Active if now >= self.last_rx + iv => {
                let id = self.next_id;
                self.next_id += 1;
                let _ = crate::framing::encode_request(&mut self.out, id, "echo", &[(); 0]);
                self.pending.insert(id, None);
                self.stats.probes_sent += 1;
                self.probe = ProbeState::Idle { since: now };
                Ok(())
            }
            ProbeState::Idle { since } if now >= since + iv => {
                Err(ProbeTimeout(now - self.last_rx))
            }
            _ => Ok(()),
        }
    }

    /// Requests waiting for a response (including probe echoes).
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Takes the tokens of all requests still waiting (when the connection is lost).
    pub fn drain_pending(&mut self) -> impl Iterator<Item = T> + '_ {
        self.pending.drain().filter_map(|(_, t)| t)
    }
}

/// Handles one message; false if it is not a valid JSON-RPC message after all.
fn handle_message<T>(
    msg: RawMessage<'_>,
    pending: &mut HashMap<u64, Option<T>>,
    out: &mut Vec<u8>,
    events: &mut VecDeque<Event<T>>,
    stats: &mut Stats,
) -> bool {
    let json = |v: &RawValue| serde_json::from_str::<Json>(v.get()).unwrap_or(Json::Null);
    let string = |v: &RawValue| serde_json::from_str::<String>(v.get()).ok();
    match msg {
        RawMessage::Response { id, result } => {
            let Some(token) = id
                .get()
                .parse::<u64>()
                .ok()
                .and_then(|i| pending.remove(&i))
            else {
                stats.unmatched += 1;
                return true;
            };
            // No token: the reply to our own probe echo.
            if let Some(token) = token {
                stats.replies += 1;
                events.push_back(Event::Reply {
                    token,
                    result: match result {
                        Ok(Some(r)) => Ok(r.to_owned()),
                        Ok(None) => Ok(null()),
                        Err(e) => Err(OvsdbError::from_json(&json(e))),
                    },
                });
            }
        }
        RawMessage::Request { id, method, params } => {
            let Some(method) = string(method) else {
                return false;
            };
            let id = json(id);
            if method == "echo" {
                stats.echoes_answered += 1;
                let params = params.map(json).unwrap_or(Json::Array(Vec::new()));
                encode_response(out, &id, &params);
            } else {
                encode_error_response(out, &id, &Json::from(format!("unknown method {method:?}")));
            }
        }
        RawMessage::Notification { method, params } => {
            let Some(method) = string(method) else {
                return false;
            };
            stats.notifications += 1;
            events.push_back(Event::Notification(parse_notification(method, params)));
        }
    }
    true
}

/// A `null` payload.
fn null() -> Box<RawValue> {
    RawValue::from_string("null".to_owned()).unwrap_or_else(|_| unreachable!("null is JSON"))
}

fn parse_notification(method: String, params: Option<&RawValue>) -> Notification {
    let kind = match method.as_str() {
        "update" => Some(UpdateKind::Update),
        "update2" => Some(UpdateKind::Update2),
        "update3" => Some(UpdateKind::Update3),
        _ => None,
    };
    if let Some(kind) = kind {
        // The updates stay text (borrowed until copied once), to be decoded by the monitor's schema.
        let a: Option<Vec<&RawValue>> = params.and_then(|p| serde_json::from_str(p.get()).ok());
        let want = if kind == UpdateKind::Update3 { 3 } else { 2 };
        if let Some(a) = a.filter(|a| a.len() == want) {
            let monitor = serde_json::from_str(a[0].get()).unwrap_or(Json::Null);
            let last_txn_id = match kind {
                UpdateKind::Update3 => serde_json::from_str::<&str>(a[1].get())
                    .ok()
                    .and_then(|s| Uuid::parse(s).ok()),
                _ => None,
            };
            return Notification::Update {
                monitor,
                kind,
                last_txn_id,
                updates: a[want - 1].to_owned(),
            };
        }
    }
    let params = params
        .and_then(|p| serde_json::from_str(p.get()).ok())
        .unwrap_or(Json::Array(Vec::new()));
    parse_other_notification(method, params)
}

fn parse_other_notification(method: String, params: Json) -> Notification {
    let lock_name = |p: &Json| p.get(0).and_then(Json::as_str).map(str::to_owned);
    match method.as_str() {
        "locked" => match lock_name(&params) {
            Some(n) => Notification::Locked(n),
            None => Notification::Other { method, params },
        },
        "stolen" => match lock_name(&params) {
            Some(n) => Notification::Stolen(n),
            None => Notification::Other { method, params },
        },
        _ => Notification::Other { method, params },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::framing::Message;

    fn out(c: &mut Connection<u32>) -> Vec<Message> {
        let mut buf = Vec::new();
        c.take_output(&mut buf);
        let mut d = FrameDecoder::new();
        d.feed(&buf);
        let mut v = Vec::new();
        while let Some(m) = d.next_message().unwrap() {
            v.push(m);
        }
        v
    }

    #[test]
    fn matches_out_of_order_replies() {
        let t0 = Instant::now();
        let mut c: Connection<u32> = Connection::new(t0, None);
        let a = c.send_request("list_dbs", &json!([]), 10).unwrap();
        let b = c.send_request_encoded("transact", br#"["db"]"#, 20);
        let sent = out(&mut c);
        assert_eq!(
            sent[1],
            Message::Request {
                id: json!(b),
                method: "transact".into(),
                params: json!(["db"])
            }
        );
        assert_eq!(c.in_flight(), 2);
        let reply = format!(
            r#"{{"id":{b},"result":[{{}}],"error":null}}{{"id":{a},"result":null,"error":{{"error":"unknown database","details":"x"}}}}{{"id":999,"result":1,"error":null}}"#
        );
        let (p, q) = reply.as_bytes().split_at(17);
        c.feed(p, t0).unwrap();
        c.feed(q, t0).unwrap();
        match c.poll_event() {
            Some(Event::Reply {
                token: 20,
                result: Ok(r),
            }) => assert_eq!(serde_json::from_str::<Json>(r.get()).unwrap(), json!([{}])),
            e => panic!("{e:?}"),
        }
        match c.poll_event() {
            Some(Event::Reply {
                token: 10,
                result: Err(e),
            }) => {
                assert_eq!(
                    e,
                    OvsdbError {
                        error: "unknown database".into(),
                        details: Some("x".into())
                    }
                )
            }
            e => panic!("{e:?}"),
        }
        assert!(c.poll_event().is_none());
        assert_eq!(c.stats().unmatched, 1);
        assert_eq!(c.in_flight(), 0);
    }

    #[test]
    fn answers_echo_and_routes_notifications() {
        let t0 = Instant::now();
        let mut c: Connection<u32> = Connection::new(t0, None);
        c.feed(br#"{"id":"echo","method":"echo","params":[1]}{"id":null,"method":"update3","params":["m","00000000-0000-0000-0000-000000000002",{"T":{}}]}{"id":null,"method":"locked","params":["l"]}{"method":"stolen","params":["l"],"id":null}"#, t0)
            .unwrap();
        assert_eq!(
            out(&mut c),
            vec![Message::Response {
                id: json!("echo"),
                result: Ok(json!([1]))
            }]
        );
        match c.poll_event() {
            Some(Event::Notification(Notification::Update {
                monitor,
                kind,
                last_txn_id,
                updates,
            })) => {
                assert_eq!(monitor, json!("m"));
                assert_eq!(kind, UpdateKind::Update3);
                assert_eq!(last_txn_id, Some(Uuid::from_u128(2)));
                assert_eq!(
                    serde_json::from_str::<Json>(updates.get()).unwrap(),
                    json!({"T":{}})
                );
            }
            e => panic!("{e:?}"),
        }
        assert!(
            matches!(c.poll_event(), Some(Event::Notification(Notification::Locked(n))) if n == "l")
        );
        assert!(
            matches!(c.poll_event(), Some(Event::Notification(Notification::Stolen(n))) if n == "l")
        );
    }

    #[test]
    fn inactivity_probe() {
        let t0 = Instant::now();
        let s = Duration::from_secs(5);
        let mut c: Connection<u32> = Connection::new(t0, Some(s));
        assert_eq!(c.poll_timeout(), Some(t0 + s));
        c.handle_timeout(t0 + Duration::from_secs(4)).unwrap();
        assert!(!c.has_output());
        // Traffic pushes the deadline.
        c.feed(
            br#"{"id":"echo","method":"echo","params":[]}"#,
            t0 + Duration::from_secs(3),
        )
        .unwrap();
        let _ = out(&mut c);
        assert_eq!(c.poll_timeout(), Some(t0 + Duration::from_secs(8)));
        // Quiet for one interval: an echo goes out.
        c.handle_timeout(t0 + Duration::from_secs(8)).unwrap();
        let sent = out(&mut c);
        let Message::Request { id, method, .. } = &sent[0] else {
            panic!()
        };
        assert_eq!(method, "echo");
        assert_eq!(c.poll_timeout(), Some(t0 + Duration::from_secs(13)));
        // The reply resets the probe and produces no event.
        c.feed(
            format!(r#"{{"id":{id},"result":[],"error":null}}"#).as_bytes(),
            t0 + Duration::from_secs(9),
        )
        .unwrap();
        assert!(c.poll_event().is_none());
        assert_eq!(c.poll_timeout(), Some(t0 + Duration::from_secs(14)));
        // Silence for two intervals: timeout.
        c.handle_timeout(t0 + Duration::from_secs(14)).unwrap();
        assert_eq!(c.stats().probes_sent, 2);
        assert_eq!(
            c.handle_timeout(t0 + Duration::from_secs(19)),
            Err(ProbeTimeout(Duration::from_secs(10)))
        );
    }

    #[test]
    fn drain_on_disconnect() {
        let mut c: Connection<u32> = Connection::new(Instant::now(), Some(Duration::from_secs(1)));
        c.send_request("a", &json!([]), 1).unwrap();
        c.send_request("b", &json!([]), 2).unwrap();
        c.handle_timeout(Instant::now() + Duration::from_secs(2))
            .unwrap();
        let mut t: Vec<u32> = c.drain_pending().collect();
        t.sort();
        assert_eq!(t, vec![1, 2]);
    }
}
