//! Framing: OVSDB sends JSON-RPC 1.0 messages as concatenated JSON texts with no delimiter.
//!
//! [`FrameDecoder`] finds where each text ends by tracking nesting depth, strings and escapes, byte by byte,
//! across arbitrary chunk boundaries, without copying the bytes of a message more than once. Each frame is then
//! parsed into a [`Message`]. The `encode_*` functions write messages.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value as Json;

/// Default limit on one message: the initial reply to a monitor of a large database is one message.
pub const DEFAULT_MAX_MESSAGE: usize = 1 << 30;

/// Why the byte stream or one message in it could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A message grew beyond the limit before it ended (fatal: the stream is abandoned).
    #[error("message longer than the limit of {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// A byte that cannot start or continue a message outside any JSON text (fatal).
    #[error("unexpected byte 0x{byte:02x} at stream offset {offset}")]
    UnexpectedByte {
        /// The byte.
        byte: u8,
        /// Its offset from the start of the stream.
        offset: u64,
    },
    /// A complete frame that is not valid JSON (the stream can go on).
    #[error("invalid JSON: {0}")]
    Json(String),
    /// Valid JSON that is not a JSON-RPC request, response or notification (the stream can go on).
    #[error("not a JSON-RPC message: {0}")]
    NotJsonRpc(&'static str),
}

impl DecodeError {
    /// Whether the stream cannot be decoded any further.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            DecodeError::TooLarge { .. } | DecodeError::UnexpectedByte { .. }
        )
    }
}

/// The receive buffer's starting capacity.
const INITIAL_CAPACITY: usize = 64 * 1024;
/// The largest capacity kept once the buffer is drained.
const RETAINED_CAPACITY: usize = 1 << 20;

/// Splits a byte stream into complete JSON texts (objects or arrays).
#[derive(Debug)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    /// Start of the message being scanned (or of not yet scanned input).
    start: usize,
    /// Next byte to scan.
    pos: usize,
    depth: u32,
    in_string: bool,
    escape: bool,
    max: usize,
    /// Stream offset of `buf[0]`.
    base: u64,
    failed: Option<DecodeError>,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameDecoder {
    /// A decoder with the default message size limit.
    pub fn new() -> Self {
        Self::with_max_message(DEFAULT_MAX_MESSAGE)
    }

    /// A decoder that rejects messages longer than `max` bytes.
    pub fn with_max_message(max: usize) -> Self {
        FrameDecoder {
            buf: Vec::with_capacity(INITIAL_CAPACITY),
            start: 0,
            pos: 0,
            depth: 0,
            in_string: false,
            escape: false,
            max: max.max(1),
            base: 0,
            failed: None,
        }
    }

    fn compact(&mut self) {
        if self.start == 0 {
            return;
        }
        if self.start == self.buf.len() {
            self.buf.clear();
            // A big message (an initial monitor reply of a large database) must not pin its buffer for the
            // connection's life: it would cost the replica hundreds of bytes per row.
            if self.buf.capacity() > RETAINED_CAPACITY {
                self.buf.shrink_to(INITIAL_CAPACITY);
            }
        } else if self.start >= self.buf.len() / 2 || self.start >= 1 << 20 {
            self.buf.drain(..self.start);
        } else {
            return;
        }
        self.base += self.start as u64;
        self.pos -= self.start;
        self.start = 0;
    }

    /// Appends received bytes.
    pub fn feed(&mut self, data: &[u8]) {
        self.compact();
        self.buf.extend_from_slice(data);
    }

    /// The buffer to read into directly (append only), with at least `reserve` bytes of spare capacity.
    pub fn read_buffer(&mut self, reserve: usize) -> &mut Vec<u8> {
        self.compact();
        self.buf.reserve(reserve);
        &mut self.buf
    }

    /// Bytes received but not yet returned as frames.
    pub fn pending_bytes(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next complete JSON text, if the input holds one. Errors are sticky.
    pub fn next_frame(&mut self) -> Result<Option<&[u8]>, DecodeError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        match self.scan() {
            Ok(Some((s, e))) => Ok(Some(&self.buf[s..e])),
            Ok(None) => Ok(None),
            Err(e) => {
                self.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    fn scan(&mut self) -> Result<Option<(usize, usize)>, DecodeError> {
        let buf = &self.buf;
        let len = buf.len();
        let mut i = self.pos;
        let limit = self.max;
        while i < len {
            if self.in_string {
                if self.escape {
                    self.escape = false;
                    i += 1;
                } else {
                    match memchr::memchr2(b'"', b'\\', &buf[i..]) {
                        Some(off) => {
                            i += off;
                            if buf[i] == b'"' {
                                self.in_string = false;
                            } else {
                                self.escape = true;
                            }
                            i += 1;
                        }
                        None => i = len,
                    }
                }
                if i - self.start > limit {
                    return Err(DecodeError::TooLarge { limit });
                }
                continue;
            }
            let c = buf[i];
            if self.depth == 0 {
                match c {
                    b'{' | b'[' => {
                        self.start = i;
                        self.depth = 1;
                    }
                    b' ' | b'\t' | b'\n' | b'\r' => {
                        i += 1;
                        self.start = i;
                        continue;
                    }
                    _ => {
                        return Err(DecodeError::UnexpectedByte {
                            byte: c,
                            offset: self.base + i as u64,
                        })
                    }
                }
            } else {
                match c {
                    b'{' | b'[' => self.depth += 1,
                    b'}' | b']' => {
                        self.depth -= 1;
                        if self.depth == 0 {
                            let s = self.start;
                            i += 1;
                            if i - s > limit {
                                return Err(DecodeError::TooLarge { limit });
                            }
                            self.start = i;
                            self.pos = i;
                            return Ok(Some((s, i)));
                        }
                    }
                    b'"' => self.in_string = true,
                    _ => {}
                }
            }
            i += 1;
            if i - self.start > limit {
                return Err(DecodeError::TooLarge { limit });
            }
        }
        self.pos = i;
        Ok(None)
    }

    /// The next complete message, parsed.
    pub fn next_message(&mut self) -> Result<Option<Message>, DecodeError> {
        match self.next_frame()? {
            Some(f) => Message::parse(f).map(Some),
            None => Ok(None),
        }
    }

    /// The next complete message with its payload left as JSON text borrowed from the buffer (see
    /// [`RawMessage`]).
    pub fn next_raw_message(&mut self) -> Result<Option<RawMessage<'_>>, DecodeError> {
        match self.next_frame()? {
            Some(f) => RawMessage::parse(f).map(Some),
            None => Ok(None),
        }
    }
}

/// A JSON-RPC message whose payload (`params`, `result`, `error`) is left as JSON text, for a reader that knows
/// its shape to decode it directly (a monitor reply is decoded into rows without a `Value` tree). It is
/// classified exactly as [`Message::parse`] classifies the same frame.
#[derive(Debug, Clone, Copy)]
pub enum RawMessage<'a> {
    /// A call that expects a response.
    Request {
        /// The request id.
        id: &'a RawValue,
        /// The method name.
        method: &'a RawValue,
        /// The parameters (None: absent or null, read as an empty array).
        params: Option<&'a RawValue>,
    },
    /// A call with a null id.
    Notification {
        /// The method name (a JSON string).
        method: &'a RawValue,
        /// The parameters (None: absent or null).
        params: Option<&'a RawValue>,
    },
    /// The answer to a request.
    Response {
        /// The id of the request answered.
        id: &'a RawValue,
        /// `Ok(result)` (None: absent or null), or `Err(error)` when `error` is not null.
        result: Result<Option<&'a RawValue>, &'a RawValue>,
    },
}

#[derive(Deserialize)]
struct BorrowedMessage<'a> {
    #[serde(default, borrow)]
    id: Option<&'a RawValue>,
    #[serde(default, borrow)]
    method: Option<&'a RawValue>,
    #[serde(default, borrow)]
    params: Option<&'a RawValue>,
    #[serde(default, borrow)]
    result: Option<&'a RawValue>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
}

fn non_null(v: Option<&RawValue>) -> Option<&RawValue> {
    v.filter(|v| v.get() != "null")
}

impl<'a> RawMessage<'a> {
    /// Parses one JSON text, checking its syntax but decoding only the envelope.
    pub fn parse(frame: &'a [u8]) -> Result<RawMessage<'a>, DecodeError> {
        if frame.first() != Some(&b'{') {
            return Err(DecodeError::NotJsonRpc("not a JSON object"));
        }
        let shape = || DecodeError::NotJsonRpc("not an object of the expected shape");
        let raw: BorrowedMessage<'a> = match serde_json::from_slice(frame) {
            Ok(r) => r,
            Err(e) if e.is_data() => return Err(shape()),
            Err(e) => return Err(DecodeError::Json(e.to_string())),
        };
        // A method that is not a string fails Message::parse as a data error: the same here.
        let method = non_null(raw.method);
        if method.is_some_and(|m| !m.get().starts_with('"')) {
            return Err(shape());
        }
        match (method, non_null(raw.id)) {
            (Some(method), Some(id)) => Ok(RawMessage::Request {
                id,
                method,
                params: non_null(raw.params),
            }),
            (Some(method), None) => Ok(RawMessage::Notification {
                method,
                params: non_null(raw.params),
            }),
            (None, Some(id)) => Ok(RawMessage::Response {
                id,
                result: match non_null(raw.error) {
                    None => Ok(non_null(raw.result)),
                    Some(e) => Err(e),
                },
            }),
            (None, None) => Err(DecodeError::NotJsonRpc("neither a method nor an id")),
        }
    }

    /// The fully decoded message (as [`Message::parse`] gives it).
    pub fn to_message(&self) -> Result<Message, DecodeError> {
        let json = |v: &RawValue| -> Result<Json, DecodeError> {
            serde_json::from_str(v.get()).map_err(|e| DecodeError::Json(e.to_string()))
        };
        let method = |v: &RawValue| -> Result<String, DecodeError> {
            serde_json::from_str(v.get())
                .map_err(|_| DecodeError::NotJsonRpc("not an object of the expected shape"))
        };
        let params = |p: Option<&RawValue>| p.map(json).unwrap_or(Ok(Json::Array(Vec::new())));
        Ok(match *self {
            RawMessage::Request {
                id,
                method: m,
                params: p,
            } => Message::Request {
                id: json(id)?,
                method: method(m)?,
                params: params(p)?,
            },
            RawMessage::Notification {
                method: m,
                params: p,
            } => Message::Notification {
                method: method(m)?,
                params: params(p)?,
            },
            RawMessage::Response { id, result } => Message::Response {
                id: json(id)?,
                result: match result {
                    Ok(r) => Ok(r.map(json).unwrap_or(Ok(Json::Null))?),
                    Err(e) => Err(json(e)?),
                },
            },
        })
    }
}

/// A JSON-RPC 1.0 message as OVSDB uses it.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// A call that expects a response with the same `id`.
    Request {
        /// The request id (any JSON; ours are integers, the server's echo uses `"echo"`).
        id: Json,
        /// The method name.
        method: String,
        /// The parameters (an array).
        params: Json,
    },
    /// A call with a null id: no response.
    Notification {
        /// The method name.
        method: String,
        /// The parameters (an array).
        params: Json,
    },
    /// The answer to a request.
    Response {
        /// The id of the request answered.
        id: Json,
        /// `Ok(result)`, or `Err(error)` when `error` is not null.
        result: Result<Json, Json>,
    },
}

#[derive(Deserialize)]
struct OwnedMessage {
    #[serde(default)]
    id: Option<Json>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    params: Option<Json>,
    #[serde(default)]
    result: Option<Json>,
    #[serde(default)]
    error: Option<Json>,
}

impl Message {
    /// Parses one JSON text.
    pub fn parse(frame: &[u8]) -> Result<Message, DecodeError> {
        if frame.first() != Some(&b'{') {
            return Err(DecodeError::NotJsonRpc("not a JSON object"));
        }
        let raw: OwnedMessage = match serde_json::from_slice(frame) {
            Ok(r) => r,
            Err(e) if e.is_data() => {
                return Err(DecodeError::NotJsonRpc(
                    "not an object of the expected shape",
                ))
            }
            Err(e) => return Err(DecodeError::Json(e.to_string())),
        };
        match (raw.method, raw.id) {
            (Some(method), Some(id)) => Ok(Message::Request {
                id,
                method,
                params: raw.params.unwrap_or(Json::Array(Vec::new())),
            }),
            (Some(method), None) => Ok(Message::Notification {
                method,
                params: raw.params.unwrap_or(Json::Array(Vec::new())),
            }),
            (None, Some(id)) => Ok(Message::Response {
                id,
                result: match raw.error {
                    None => Ok(raw.result.unwrap_or(Json::Null)),
                    Some(e) => Err(e),
                },
            }),
            (None, None) => Err(DecodeError::NotJsonRpc("neither a method nor an id")),
        }
    }

    /// Appends the message's JSON text to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        // Serializing a serde_json::Value into a Vec cannot fail.
        let _ = match self {
            Message::Request { id, method, params } => {
                serde_json::to_writer(out, &OutRequest { method, params, id })
            }
            Message::Notification { method, params } => serde_json::to_writer(
                out,
                &OutRequest {
                    method,
                    params,
                    id: &Json::Null,
                },
            ),
            Message::Response { id, result } => {
                let (r, e) = match result {
                    Ok(r) => (r, &Json::Null),
                    Err(e) => (&Json::Null, e),
                };
                serde_json::to_writer(
                    out,
                    &OutResponse {
                        id,
                        result: r,
                        error: e,
                    },
                )
            }
        };
    }
}

#[derive(Serialize)]
struct OutRequest<'a, P: Serialize + ?Sized, I: Serialize + ?Sized> {
    method: &'a str,
    params: &'a P,
    id: &'a I,
}

#[derive(Serialize)]
struct OutResponse<'a> {
    id: &'a Json,
    result: &'a Json,
    error: &'a Json,
}

/// Appends a request `{"method":..,"params":..,"id":id}` to `out`; `params` must serialize to an array.
pub fn encode_request<P: Serialize + ?Sized>(
    out: &mut Vec<u8>,
    id: u64,
    method: &str,
    params: &P,
) -> Result<(), serde_json::Error> {
    let mark = out.len();
    let r = serde_json::to_writer(
        &mut *out,
        &OutRequest {
            method,
            params,
            id: &id,
        },
    );
    if r.is_err() {
        out.truncate(mark);
    }
    r
}

/// Appends a successful response to `out`.
pub fn encode_response(out: &mut Vec<u8>, id: &Json, result: &Json) {
    let _ = serde_json::to_writer(
        out,
        &OutResponse {
            id,
            result,
            error: &Json::Null,
        },
    );
}

/// Appends an error response to `out`.
pub fn encode_error_response(out: &mut Vec<u8>, id: &Json, error: &Json) {
    let _ = serde_json::to_writer(
        out,
        &OutResponse {
            id,
            result: &Json::Null,
            error,
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn all(dec: &mut FrameDecoder) -> Vec<Result<Message, DecodeError>> {
        let mut out = Vec::new();
        loop {
            match dec.next_message() {
                Ok(Some(m)) => out.push(Ok(m)),
                Ok(None) => break,
                Err(e) => {
                    let fatal = e.is_fatal();
                    out.push(Err(e));
                    if fatal {
                        break;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn splits_concatenated_messages() {
        let text = br#"{"id":1,"result":["a}b\"{",{"x":[1,2]}],"error":null}  {"method":"echo","params":[],"id":"echo"}
{"method":"update2","params":["m",{}],"id":null}"#;
        let mut d = FrameDecoder::new();
        d.feed(text);
        let msgs = all(&mut d);
        assert_eq!(msgs.len(), 3);
        assert_eq!(
            msgs[0],
            Ok(Message::Response {
                id: json!(1),
                result: Ok(json!(["a}b\"{", {"x": [1, 2]}]))
            })
        );
        assert!(matches!(&msgs[1], Ok(Message::Request { method, .. }) if method == "echo"));
        assert!(
            matches!(&msgs[2], Ok(Message::Notification { method, .. }) if method == "update2")
        );
        assert_eq!(d.pending_bytes(), 0);
    }

    #[test]
    fn a_drained_big_message_does_not_pin_its_buffer() {
        let big = format!(
            r#"{{"id":1,"result":"{}","error":null}}"#,
            "x".repeat(8 << 20)
        );
        let mut d = FrameDecoder::new();
        d.feed(big.as_bytes());
        assert_eq!(all(&mut d).len(), 1);
        assert!(d.read_buffer(4096).capacity() <= RETAINED_CAPACITY);
        // Input still pending is kept whole.
        d.feed(br#"{"id":2,"result":1,"#);
        d.feed(br#""error":null}"#);
        assert_eq!(all(&mut d).len(), 1);
    }

    #[test]
    fn byte_by_byte() {
        let text = br#"{"id":1,"result":"\\\"}","error":null}{"id":2,"result":null,"error":{"error":"x"}}"#;
        let mut d = FrameDecoder::new();
        let mut got = Vec::new();
        for b in text.iter() {
            d.feed(std::slice::from_ref(b));
            while let Some(m) = d.next_message().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[0],
            Message::Response {
                id: json!(1),
                result: Ok(json!("\\\"}"))
            }
        );
        assert_eq!(
            got[1],
            Message::Response {
                id: json!(2),
                result: Err(json!({"error": "x"}))
            }
        );
    }

    #[test]
    fn limits_and_garbage() {
        let mut d = FrameDecoder::with_max_message(16);
        d.feed(br#"{"id":1,"result":"0123456789","error":null}"#);
        assert_eq!(d.next_frame(), Err(DecodeError::TooLarge { limit: 16 }));
        assert!(d.next_frame().is_err(), "errors are sticky");
        let mut d = FrameDecoder::new();
        d.feed(b" x{}");
        assert_eq!(
            d.next_frame(),
            Err(DecodeError::UnexpectedByte {
                byte: b'x',
                offset: 1
            })
        );
        let mut d = FrameDecoder::new();
        d.feed(b"{\"a\" 1}[1]");
        assert!(matches!(d.next_message(), Err(DecodeError::Json(_))));
        assert!(matches!(d.next_message(), Err(DecodeError::NotJsonRpc(_))));
    }

    #[test]
    fn encoding() {
        let mut out = Vec::new();
        encode_request(&mut out, 7, "transact", &json!(["db"])).unwrap();
        encode_response(&mut out, &json!("echo"), &json!([]));
        let mut d = FrameDecoder::new();
        d.feed(&out);
        assert_eq!(
            d.next_message().unwrap(),
            Some(Message::Request {
                id: json!(7),
                method: "transact".into(),
                params: json!(["db"])
            })
        );
        assert_eq!(
            d.next_message().unwrap(),
            Some(Message::Response {
                id: json!("echo"),
                result: Ok(json!([]))
            })
        );
    }

    fn json_value() -> impl Strategy<Value = Json> {
        let leaf = prop_oneof![
            Just(Json::Null),
            any::<bool>().prop_map(Json::Bool),
            any::<i64>().prop_map(Json::from),
            "[a-z\"\\\\{}\\[\\] \u{e9}\u{1F600}]{0,8}".prop_map(Json::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Json::Array),
                proptest::collection::btree_map("[a-z{}\"]{0,4}", inner, 0..4)
                    .prop_map(|m| Json::Object(m.into_iter().collect())),
            ]
        })
    }

    fn message() -> impl Strategy<Value = Message> {
        prop_oneof![
            (
                any::<u32>(),
                "[a-z_]{1,8}",
                proptest::collection::vec(json_value(), 0..3)
            )
                .prop_map(|(id, m, p)| {
                    Message::Request {
                        id: json!(id),
                        method: m,
                        params: Json::Array(p),
                    }
                }),
            (
                "[a-z_0-9]{1,8}",
                proptest::collection::vec(json_value(), 0..3)
            )
                .prop_map(|(m, p)| Message::Notification {
                    method: m,
                    params: Json::Array(p)
                }),
            (any::<u32>(), json_value(), any::<bool>()).prop_map(|(id, v, ok)| Message::Response {
                id: json!(id),
                result: if ok || v.is_null() { Ok(v) } else { Err(v) },
            }),
        ]
    }

    proptest! {
        #[test]
        fn any_split_decodes_the_same(
            msgs in proptest::collection::vec(message(), 1..6),
            ws in proptest::collection::vec("[ \n\t\r]{0,2}", 6),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let mut bytes = Vec::new();
            for (i, m) in msgs.iter().enumerate() {
                bytes.extend_from_slice(ws[i].as_bytes());
                m.encode(&mut bytes);
            }
            let mut points: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
            points.sort();
            let mut d = FrameDecoder::new();
            let mut got = Vec::new();
            let mut last = 0;
            for p in points.into_iter().chain(std::iter::once(bytes.len())) {
                d.feed(&bytes[last..p]);
                last = p;
                while let Some(m) = d.next_message().unwrap() {
                    got.push(m);
                }
            }
            prop_assert_eq!(got, msgs);
        }
    }
}
