//! The HTTP layer: path routing, discovery, tables, watch streams and Status answers.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc, watch};

use crate::error::{Error, Result};
use crate::openapi;
use crate::patch::{self, PatchKind};
use crate::proto;
use crate::resources::ResourceInfo;
use crate::select::Selector;
use crate::store::{self, Event, EventType, Store};
use crate::validate;

/// Response body: a whole JSON document or a watch stream.
pub type RespBody = BoxBody<Bytes, Infallible>;

/// Any error of a request body (a socket's, or an in-process client's).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request body as the handlers read it: hyper's from a connection, or any other from an in-process
/// client. Its error is concrete: a boxed one makes the handler's future `Send` only for `'static`
/// borrows, which rustc cannot prove here.
type ReqBody = UnsyncBoxBody<Bytes, std::io::Error>;

/// State shared by every connection.
pub struct Shared {
    /// The objects.
    pub store: Store,
    /// Largest accepted request body.
    pub max_body: usize,
    /// Interval between bookmarks on watches that allow them.
    pub bookmark_interval: Duration,
    /// Turns true when the server shuts down: watch streams end, in-process requests get 503.
    pub stop: watch::Receiver<bool>,
}

struct ChannelBody(mpsc::Receiver<Bytes>);

/// Largest chunk a watch stream merges waiting lines into.
const MERGE_LIMIT: usize = 32 * 1024;

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let first = match self.0.poll_recv(cx) {
            Poll::Ready(Some(b)) => b,
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        // Lines already waiting go out in the same chunk: one chunk header and fewer writes
        // for a burst of events, instead of one per event.
        let mut merged: Option<bytes::BytesMut> = None;
        while merged.as_ref().map_or(first.len(), |m| m.len()) < MERGE_LIMIT {
            match self.0.try_recv() {
                Ok(b) => merged
                    .get_or_insert_with(|| {
                        let mut m = bytes::BytesMut::with_capacity(MERGE_LIMIT + 4096);
                        m.extend_from_slice(&first);
                        m
                    })
                    .extend_from_slice(&b),
                Err(_) => break,
            }
        }
        let data = merged.map_or(first, bytes::BytesMut::freeze);
        Poll::Ready(Some(Ok(Frame::data(data))))
    }
}

fn json_response(code: u16, v: &Value) -> Response<RespBody> {
    let body = serde_json::to_vec(v).unwrap_or_default();
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn bytes_response(code: u16, body: Bytes) -> Response<RespBody> {
    let mut r = Response::new(Full::new(body).boxed());
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn list_response(info: &ResourceInfo, meta: &Value, items: &[Arc<Value>]) -> Response<RespBody> {
    let mut out = Vec::with_capacity(64 + items.len() * 512);
    out.extend_from_slice(b"{\"kind\":");
    let _ = serde_json::to_writer(&mut out, &format!("{}List", info.kind));
    out.extend_from_slice(b",\"apiVersion\":");
    let _ = serde_json::to_writer(&mut out, &info.api_version());
    out.extend_from_slice(b",\"metadata\":");
    let _ = serde_json::to_writer(&mut out, meta);
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = serde_json::to_writer(&mut out, &**item);
    }
    out.extend_from_slice(b"]}");
    let mut r = Response::new(Full::new(Bytes::from(out)).boxed());
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn error_response(e: &Error) -> Response<RespBody> {
    json_response(e.code(), &e.to_status())
}

/// Percent-decodes a query component (`+` is a space).
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct Query(Vec<(String, String)>);

impl Query {
    fn parse(q: Option<&str>) -> Self {
        Query(
            q.unwrap_or("")
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|p| match p.split_once('=') {
                    Some((k, v)) => (decode(k), decode(v)),
                    None => (decode(p), String::new()),
                })
                .collect(),
        )
    }
    fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }
    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("1" | "true" | ""))
    }
}

struct Target {
    info: Arc<ResourceInfo>,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
    watch: bool,
}

enum Route {
    Discovery(Value),
    Resource(Target),
}

fn group_list(store: &Store) -> Value {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for r in store.resources() {
        if r.group.is_empty() {
            continue;
        }
        match groups.iter_mut().find(|(g, _)| *g == r.group) {
            Some((_, vs)) if !vs.contains(&r.version) => vs.push(r.version.clone()),
            Some(_) => {}
            None => groups.push((r.group.clone(), vec![r.version.clone()])),
        }
    }
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|(g, vs)| {
            let versions: Vec<Value> = vs
                .iter()
                .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                .collect();
            json!({"name": g, "versions": versions, "preferredVersion": versions[0]})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn resource_list(store: &Store, group: &str, version: &str) -> Option<Value> {
    let rs: Vec<Value> = store
        .resources()
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .flat_map(|r| r.discovery())
        .collect();
    if rs.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": rs}),
    )
}

fn route(store: &Store, path: &str) -> Result<Route> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => {
            return Ok(Route::Discovery(json!({
                "major": "1", "minor": "32", "gitVersion": "v1.32.0-kube-ovn-testapi", "gitCommit": "",
                "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.23",
                "compiler": "gc", "platform": "linux/amd64"
            })))
        }
        ["api"] => {
            return Ok(Route::Discovery(
                json!({"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
            ))
        }
        ["apis"] => return Ok(Route::Discovery(group_list(store))),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(Error::no_resource()),
    };
    if rest.is_empty() {
        return resource_list(store, group, version)
            .map(Route::Discovery)
            .ok_or_else(Error::no_resource);
    }
    let (watch, rest) = match rest {
        ["watch", r @ ..] => (true, r),
        r => (false, r),
    };
    let find = |plural: &str| {
        store
            .resource(group, version, plural)
            .ok_or_else(Error::no_resource)
    };
    let s = |x: &&str| Some((*x).to_owned());
    let t = match rest {
        ["namespaces", ns, sub @ ("status" | "finalize")] => Target {
            info: find("namespaces")?,
            ns: None,
            name: s(ns),
            sub: s(sub),
            watch,
        },
        ["namespaces", ns, plural, name @ ..] if name.len() <= 2 => {
            let info = find(plural)?;
            if !info.namespaced {
                return Err(Error::no_resource());
            }
            Target {
                info,
                ns: s(ns),
                name: name.first().and_then(s),
                sub: name.get(1).and_then(s),
                watch,
            }
        }
        [plural, name @ ..] if name.len() <= 2 => Target {
            info: find(plural)?,
            ns: None,
            name: name.first().and_then(s),
            sub: name.get(1).and_then(s),
            watch,
        },
        _ => return Err(Error::no_resource()),
    };
    match t.sub.as_deref() {
        None => {}
        Some("status") if t.info.status => {}
        Some("scale") if t.info.scale && t.name.is_some() && !t.watch => {}
        Some(_) => return Err(Error::no_resource()),
    }
    Ok(Route::Resource(t))
}

/// Serves one request, whatever its body type (hyper's `Incoming` from a socket, kube-client's `Body`
/// in-process).
pub fn handle<B>(
    shared: Arc<Shared>,
    req: Request<B>,
) -> impl std::future::Future<Output = Response<RespBody>> + Send
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    // Boxed here, outside the future: the future is then one type whatever `B` is.
    let req = req.map(|b| b.map_err(box_error::<B::Error>).boxed_unsync());
    handle_boxed(shared, req)
}

fn box_error<E: Into<BoxError>>(e: E) -> std::io::Error {
    std::io::Error::other(e.into())
}

async fn handle_boxed(shared: Arc<Shared>, req: Request<ReqBody>) -> Response<RespBody> {
    if *shared.stop.borrow() {
        return error_response(&Error::unavailable("the server is shut down"));
    }
    match handle_inner(&shared, req).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

async fn read_body(shared: &Shared, req: Request<ReqBody>) -> Result<Value> {
    let ct = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|c| c.to_str().ok())
        .unwrap_or("");
    let base = ct.split(';').next().unwrap_or("").trim();
    let protobuf = base == proto::CONTENT_TYPE && req.method() != Method::PATCH;
    if !(protobuf
        || base.is_empty()
        || base == "application/json"
        || base.ends_with("+json")
        || req.method() == Method::PATCH)
    {
        // CBOR is not spoken: client-go falls back to JSON on 415.
        return Err(Error::unsupported_media(base));
    }
    if let Some(len) = req.headers().get(hyper::header::CONTENT_LENGTH) {
        if len
            .to_str()
            .ok()
            .and_then(|l| l.parse::<usize>().ok())
            .is_some_and(|l| l > shared.max_body)
        {
            return Err(Error::too_large(shared.max_body));
        }
    }
    let body = Limited::new(req.into_body(), shared.max_body)
        .collect()
        .await
        .map_err(|_| Error::too_large(shared.max_body))?
        .to_bytes();
    if protobuf {
        return proto::decode_body(&body);
    }
    serde_json::from_slice(&body)
        .map_err(|e| Error::bad_request(format!("the body of the request is not valid JSON: {e}")))
}

/// `/openapi/v2` (protobuf when asked, as kubectl does), `/openapi/v3` and its group versions.
fn openapi_response(
    store: &Store,
    rest: &str,
    req: &Request<ReqBody>,
) -> Result<Response<RespBody>> {
    let segs: Vec<&str> = rest.trim_matches('/').split('/').collect();
    match segs.as_slice() {
        ["v2"] => {
            let doc = openapi::v2(store);
            let accept = req
                .headers()
                .get(hyper::header::ACCEPT)
                .and_then(|a| a.to_str().ok())
                .unwrap_or("");
            if accept.contains(openapi::V2_PROTOBUF) {
                let mut r = bytes_response(200, Bytes::from(openapi::v2_protobuf(&doc)));
                r.headers_mut().insert(
                    hyper::header::CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static(openapi::V2_PROTOBUF_ANSWER),
                );
                return Ok(r);
            }
            Ok(json_response(200, &doc))
        }
        ["v3"] => Ok(json_response(200, &openapi::v3_root(store))),
        ["v3", "api", v] => openapi::v3_group_version(store, "", v)
            .map(|d| json_response(200, &d))
            .ok_or_else(Error::no_resource),
        ["v3", "apis", g, v] => openapi::v3_group_version(store, g, v)
            .map(|d| json_response(200, &d))
            .ok_or_else(Error::no_resource),
        _ => Err(Error::no_resource()),
    }
}

fn wants_table(req: &Request<ReqBody>) -> bool {
    req.headers()
        .get(hyper::header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

async fn handle_inner(shared: &Arc<Shared>, req: Request<ReqBody>) -> Result<Response<RespBody>> {
    let path = req.uri().path().to_owned();
    if let Some(rest) = path.strip_prefix("/openapi/") {
        if req.method() != Method::GET {
            return Err(Error::method_not_allowed());
        }
        return openapi_response(&shared.store, rest, &req);
    }
    if path == "/healthz" || path == "/readyz" || path == "/livez" {
        let mut r = Response::new(Full::new(Bytes::from_static(b"ok")).boxed());
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/plain"),
        );
        return Ok(r);
    }
    let q = Query::parse(req.uri().query());
    let store = &shared.store;
    let t = match route(store, &path)? {
        Route::Discovery(v) => {
            if req.method() != Method::GET {
                return Err(Error::method_not_allowed());
            }
            return Ok(json_response(200, &v));
        }
        Route::Resource(t) => t,
    };
    let info = t.info.clone();
    let ns = t.ns.as_deref();
    let table = wants_table(&req);
    let directive = validate::Directive::from_query(q.get("fieldValidation"));
    if t.sub.as_deref() == Some("scale") {
        return scale(shared, &t, req).await;
    }
    if req.method() != Method::GET && q.get("dryRun").is_some_and(|d| !d.is_empty()) {
        // Refused rather than ignored: ignoring it would persist what the client only tried.
        return Err(Error::bad_request(
            "dryRun is not supported by this test API server: nothing was changed",
        ));
    }
    match (req.method().clone(), t.name.as_deref()) {
        (Method::GET, Some(name)) if !t.watch => {
            let obj = store.get(&info, ns, name)?;
            if table {
                return Ok(json_response(
                    200,
                    &to_table(&info, &[obj], store.resource_version(), &q),
                ));
            }
            Ok(json_response(200, &obj))
        }
        (Method::GET, name) => {
            let labels = Selector::labels(q.get("labelSelector").unwrap_or(""))?;
            let mut fields = Selector::fields(q.get("fieldSelector").unwrap_or(""))?;
            if let Some(name) = name {
                fields = Selector::fields(&format!("metadata.name={name}"))?;
            }
            if t.watch || q.flag("watch") && q.get("watch").is_some() {
                return watch(shared, info, t.ns, labels, fields, &q, table);
            }
            let limit: usize = q
                .get("limit")
                .and_then(|l| l.parse().ok())
                .filter(|l| *l > 0)
                .unwrap_or(usize::MAX);
            let cont = q
                .get("continue")
                .filter(|c| !c.is_empty())
                .map(str::to_owned);
            let after: Option<(String, String)> = match &cont {
                Some(c) => {
                    let (ns, name) = c
                        .split_once('/')
                        .ok_or_else(|| Error::bad_request("invalid continue token"))?;
                    Some((ns.to_owned(), name.to_owned()))
                }
                None => None,
            };
            let key = |v: &Value| {
                let m = |f: &str| {
                    v.pointer(&format!("/metadata/{f}"))
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned()
                };
                (m("namespace"), m("name"))
            };
            // remainingItemCount is only given for unfiltered lists, as the real server does.
            let unfiltered = labels.is_empty() && fields.is_empty();
            let (snap, rest) = store.list_page(&info, ns, after.as_ref(), limit, unfiltered, |v| {
                labels.matches(v) && fields.matches(v)
            });
            let items = snap.items;
            let mut meta = json!({"resourceVersion": snap.rv.to_string()});
            if rest > 0 {
                if let Some(last) = items.last() {
                    let (n, m) = key(last);
                    meta["continue"] = Value::String(format!("{n}/{m}"));
                    if unfiltered {
                        meta["remainingItemCount"] = json!(rest);
                    }
                }
            }
            if table {
                return Ok(json_response(200, &to_table(&info, &items, snap.rv, &q)));
            }
            Ok(list_response(&info, &meta, &items))
        }
        (Method::POST, None) => {
            if info.namespaced && ns.is_none() {
                return Err(Error::method_not_allowed());
            }
            let body = read_body(shared, req).await?;
            let warnings = check_fields(store, &info, &body, directive)?;
            let ev = store.create_event(&info, ns, body)?;
            Ok(with_warnings(
                bytes_response(201, ev.object_json()),
                &warnings,
            ))
        }
        (Method::PUT, Some(name)) => {
            let name = name.to_owned();
            let status_only = t.sub.is_some();
            let body = read_body(shared, req).await?;
            let warnings = check_fields(store, &info, &body, directive)?;
            let ev = store.update_event(&info, t.ns.as_deref(), &name, body, status_only)?;
            Ok(with_warnings(
                bytes_response(200, ev.object_json()),
                &warnings,
            ))
        }
        (Method::PATCH, Some(name)) => {
            let name = name.to_owned();
            let ct = req
                .headers()
                .get(hyper::header::CONTENT_TYPE)
                .and_then(|c| c.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let kind = PatchKind::from_content_type(&ct)?;
            let body = read_body(shared, req).await?;
            let status_only = t.sub.is_some();
            // Optimistic retry: a patch without a resourceVersion never conflicts.
            for _ in 0..16 {
                let cur = store.get(&info, t.ns.as_deref(), &name)?;
                let cur_rv = cur.pointer("/metadata/resourceVersion").cloned();
                let mut obj = (*cur).clone();
                patch::apply(kind, &mut obj, &body)?;
                let warnings = check_fields(store, &info, &obj, directive)?;
                let pinned = body.pointer("/metadata/resourceVersion").is_some();
                if !pinned {
                    if let (Some(m), Some(rv)) = (
                        obj.get_mut("metadata").and_then(Value::as_object_mut),
                        &cur_rv,
                    ) {
                        m.insert("resourceVersion".into(), rv.clone());
                    }
                }
                match store.update_event(&info, t.ns.as_deref(), &name, obj, status_only) {
                    Err(Error::Status { code: 409, .. }) if !pinned => continue,
                    Err(e) => return Err(e),
                    Ok(ev) => {
                        return Ok(with_warnings(
                            bytes_response(200, ev.object_json()),
                            &warnings,
                        ))
                    }
                }
            }
            Err(Error::conflict(&info.group, &info.plural, &name))
        }
        (Method::DELETE, Some(name)) => {
            let name = name.to_owned();
            let opts = delete_options(shared, req).await?;
            let rv = opts
                .pointer("/preconditions/resourceVersion")
                .and_then(Value::as_str);
            let obj = store.delete(&info, t.ns.as_deref(), &name, rv)?;
            Ok(json_response(200, &obj))
        }
        (Method::DELETE, None) => {
            let labels = Selector::labels(q.get("labelSelector").unwrap_or(""))?;
            let fields = Selector::fields(q.get("fieldSelector").unwrap_or(""))?;
            let snap = store.list(&info, ns, |v| labels.matches(v) && fields.matches(v));
            let mut deleted = Vec::new();
            for o in snap.items {
                let name = o
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let ons = o.pointer("/metadata/namespace").and_then(Value::as_str);
                if let Ok(d) = store.delete(&info, ons, name, None) {
                    deleted.push(d);
                }
            }
            let meta = json!({"resourceVersion": store.resource_version().to_string()});
            Ok(list_response(&info, &meta, &deleted))
        }
        _ => Err(Error::method_not_allowed()),
    }
}

/// The `autoscaling/v1` `Scale` of a workload: its `spec.replicas` and label selector.
fn scale_of(obj: &Value) -> Value {
    let selector: Vec<String> = obj
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
        .collect();
    let meta = |f: &str| {
        obj.pointer(&format!("/metadata/{f}"))
            .cloned()
            .unwrap_or(Value::Null)
    };
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {"name": meta("name"), "namespace": meta("namespace"), "uid": meta("uid"),
            "resourceVersion": meta("resourceVersion"), "creationTimestamp": meta("creationTimestamp")},
        // The real server defaults an absent replicas to 1 on create.
        "spec": {"replicas": obj.pointer("/spec/replicas").cloned().unwrap_or(json!(1))},
        "status": {"replicas": obj.pointer("/status/replicas").cloned().unwrap_or(json!(0)),
            "selector": selector.join(",")},
    })
}

/// `.../deployments/NAME/scale`: reads and writes `spec.replicas` through a `Scale`.
async fn scale(
    shared: &Arc<Shared>,
    t: &Target,
    req: Request<ReqBody>,
) -> Result<Response<RespBody>> {
    let store = &shared.store;
    let info = &t.info;
    let ns = t.ns.as_deref();
    let name = t.name.as_deref().unwrap_or("");
    let method = req.method().clone();
    if method == Method::GET {
        return Ok(json_response(200, &scale_of(&*store.get(info, ns, name)?)));
    }
    let kind = match method {
        Method::PUT => None,
        Method::PATCH => Some(PatchKind::from_content_type(
            req.headers()
                .get(hyper::header::CONTENT_TYPE)
                .and_then(|c| c.to_str().ok())
                .unwrap_or(""),
        )?),
        _ => return Err(Error::method_not_allowed()),
    };
    let body = read_body(shared, req).await?;
    let pinned = body
        .pointer("/metadata/resourceVersion")
        .is_some_and(|v| v != "");
    // Optimistic retry as for patches: a write without a resourceVersion never conflicts.
    for _ in 0..16 {
        let cur = store.get(info, ns, name)?;
        let mut sc = scale_of(&cur);
        match kind {
            Some(k) => patch::apply(k, &mut sc, &body)?,
            None => sc = body.clone(),
        }
        let replicas = sc
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .filter(|r| (0..=i64::from(i32::MAX)).contains(r))
            .ok_or_else(|| Error::invalid("spec.replicas: must be a non-negative integer"))?;
        let mut obj = (*cur).clone();
        if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
            spec.insert("replicas".into(), json!(replicas));
        } else {
            obj["spec"] = json!({"replicas": replicas});
        }
        if pinned {
            obj["metadata"]["resourceVersion"] = sc["metadata"]["resourceVersion"].clone();
        }
        match store.update_event(info, ns, name, obj, false) {
            Err(Error::Status { code: 409, .. }) if !pinned => continue,
            Err(e) => return Err(e),
            Ok(ev) => return Ok(json_response(200, &scale_of(&ev.object))),
        }
    }
    Err(Error::conflict(&info.group, &info.plural, name))
}

/// Unknown fields under `fieldValidation`: an error when Strict, warnings when Warn.
fn check_fields(
    store: &Store,
    info: &ResourceInfo,
    obj: &Value,
    directive: validate::Directive,
) -> Result<Vec<String>> {
    if directive == validate::Directive::Ignore {
        return Ok(Vec::new());
    }
    let unknown = validate::unknown_fields(store, info, obj);
    if unknown.is_empty() {
        return Ok(unknown);
    }
    if directive == validate::Directive::Strict {
        return Err(Error::bad_request(validate::strict_error(info, &unknown)));
    }
    Ok(unknown
        .iter()
        .map(|f| format!("unknown field \"{f}\""))
        .collect())
}

/// Adds one `Warning: 299 - "..."` header per warning, as kubectl prints them.
fn with_warnings(mut r: Response<RespBody>, warnings: &[String]) -> Response<RespBody> {
    for w in warnings {
        let text = format!("299 - {}", serde_json::Value::String(w.clone()));
        if let Ok(h) = hyper::header::HeaderValue::from_str(&text) {
            r.headers_mut().append(hyper::header::WARNING, h);
        }
    }
    r
}

async fn delete_options(shared: &Shared, req: Request<ReqBody>) -> Result<Value> {
    let empty = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|l| l.to_str().ok())
        .is_some_and(|l| l == "0");
    if empty {
        return Ok(json!({}));
    }
    let body = Limited::new(req.into_body(), shared.max_body)
        .collect()
        .await
        .map_err(|_| Error::too_large(shared.max_body))?
        .to_bytes();
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    serde_json::from_slice(&body)
        .map_err(|e| Error::bad_request(format!("invalid DeleteOptions: {e}")))
}

fn age(obj: &Value) -> String {
    let Some(t) = obj
        .pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(store::parse_rfc3339)
    else {
        return "<unknown>".into();
    };
    let now = store::parse_rfc3339(&store::now_rfc3339()).unwrap_or(t);
    let s = (now - t).max(0);
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// Renders one table row's cells from an object.
type CellsFn = dyn Fn(&Value) -> Vec<Value>;

fn to_table(info: &ResourceInfo, items: &[Arc<Value>], rv: u64, q: &Query) -> Value {
    let col = |n: &str, ty: &str| json!({"name": n, "type": ty, "format": if n == "Name" {"name"} else {""}, "description": "", "priority": 0});
    let s = |o: &Value, p: &str| {
        o.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("<none>")
            .to_owned()
    };
    let (cols, cells): (Vec<Value>, Box<CellsFn>) = match info.key().as_str() {
        "/pods" => (
            vec![
                col("Name", "string"),
                col("Status", "string"),
                col("Node", "string"),
                col("Age", "string"),
            ],
            Box::new(move |o| {
                vec![
                    json!(s(o, "/metadata/name")),
                    json!(o
                        .pointer("/status/phase")
                        .and_then(Value::as_str)
                        .unwrap_or("Pending")),
                    json!(s(o, "/spec/nodeName")),
                    json!(age(o)),
                ]
            }),
        ),
        "/namespaces" => (
            vec![
                col("Name", "string"),
                col("Status", "string"),
                col("Age", "string"),
            ],
            Box::new(move |o| {
                vec![
                    json!(s(o, "/metadata/name")),
                    json!(s(o, "/status/phase")),
                    json!(age(o)),
                ]
            }),
        ),
        "/services" => (
            vec![
                col("Name", "string"),
                col("Type", "string"),
                col("Cluster-IP", "string"),
                col("External-IP", "string"),
                col("Port(s)", "string"),
                col("Age", "string"),
                json!({"name": "Selector", "type": "string", "format": "", "description": "", "priority": 1}),
            ],
            Box::new(move |o| {
                vec![
                    json!(s(o, "/metadata/name")),
                    json!(o
                        .pointer("/spec/type")
                        .and_then(Value::as_str)
                        .unwrap_or("ClusterIP")),
                    json!(s(o, "/spec/clusterIP")),
                    json!(service_external_ip(o)),
                    json!(service_ports(o)),
                    json!(age(o)),
                    json!(service_selector(o)),
                ]
            }),
        ),
        _ => (
            vec![col("Name", "string"), col("Age", "string")],
            Box::new(move |o| vec![json!(s(o, "/metadata/name")), json!(age(o))]),
        ),
    };
    let full = q.get("includeObject") == Some("Object");
    let none = q.get("includeObject") == Some("None");
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let object = if full {
                (**o).clone()
            } else if none {
                Value::Null
            } else {
                json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o.get("metadata")})
            };
            json!({"cells": cells(o), "object": object})
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv.to_string()},
        "columnDefinitions": cols, "rows": rows})
}

/// The strings of a list field (`/spec/externalIPs`).
fn str_list<'a>(o: &'a Value, p: &str) -> Vec<&'a str> {
    o.pointer(p)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// `kubectl get svc`'s EXTERNAL-IP, as kube-apiserver's printer fills it.
fn service_external_ip(o: &Value) -> String {
    let external = str_list(o, "/spec/externalIPs");
    match o.pointer("/spec/type").and_then(Value::as_str) {
        None | Some("ClusterIP" | "NodePort") if external.is_empty() => "<none>".into(),
        None | Some("ClusterIP" | "NodePort") => external.join(","),
        Some("LoadBalancer") => {
            let mut all: Vec<&str> = o
                .pointer("/status/loadBalancer/ingress")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|i| i.get("ip").or_else(|| i.get("hostname"))?.as_str())
                .collect();
            all.extend(external);
            if all.is_empty() {
                "<pending>".into()
            } else {
                all.join(",")
            }
        }
        Some("ExternalName") => o
            .pointer("/spec/externalName")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        Some(_) => "<unknown>".into(),
    }
}

/// `kubectl get svc`'s PORT(S): `80/TCP`, `80:30080/TCP` with a node port.
fn service_ports(o: &Value) -> String {
    let ports: Vec<String> = o
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|p| {
            let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
            let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
            match p
                .get("nodePort")
                .and_then(Value::as_i64)
                .filter(|n| *n != 0)
            {
                Some(n) => format!("{port}:{n}/{proto}"),
                None => format!("{port}/{proto}"),
            }
        })
        .collect();
    if ports.is_empty() {
        "<none>".into()
    } else {
        ports.join(",")
    }
}

/// `kubectl get svc -o wide`'s SELECTOR.
fn service_selector(o: &Value) -> String {
    let sel: Vec<String> = o
        .pointer("/spec/selector")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
        .collect();
    if sel.is_empty() {
        "<none>".into()
    } else {
        sel.join(",")
    }
}

fn event_line(ty: &str, obj: &Value) -> Bytes {
    store::watch_line(ty, obj)
}

fn watch(
    shared: &Arc<Shared>,
    info: Arc<ResourceInfo>,
    ns: Option<String>,
    labels: Selector,
    fields: Selector,
    q: &Query,
    table: bool,
) -> Result<Response<RespBody>> {
    // Streaming lists (`sendInitialEvents=true`): the current state as ADDED events, then a
    // bookmark annotated `k8s.io/initial-events-end`.
    let initial_events_end = q.get("sendInitialEvents") == Some("true");
    let from = match q.get("resourceVersion") {
        _ if initial_events_end => None,
        None | Some("" | "0") => None,
        Some(v) => Some(
            v.parse::<u64>()
                .map_err(|_| Error::bad_request(format!("invalid resourceVersion {v:?}")))?,
        ),
    };
    let bookmarks = q.flag("allowWatchBookmarks") && q.get("allowWatchBookmarks").is_some();
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0);
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let mut resp = Response::new(ChannelBody(rx).boxed());
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    let store::WatchStart {
        replay,
        rx: mut sub,
        rv: mut last_rv,
    } = match shared.store.watch(&info, from) {
        Ok(x) => x,
        Err(e) => {
            // Like the real server: a 200 stream carrying one ERROR event with the 410 Status.
            let _ = tx.try_send(event_line("ERROR", &e.to_status()));
            return Ok(resp);
        }
    };
    let key = info.key();
    let interval = shared.bookmark_interval;
    let api_version = info.api_version();
    let kind = info.kind.clone();
    let info2 = info.clone();
    let info3 = info.clone();
    let store_ref = shared.clone();
    // Which event a watcher sees: with selectors, an object that starts (stops) matching is
    // ADDED (DELETED) for that watcher, as the real server does.
    let matches = move |e: &Event| -> Option<&'static str> {
        if e.key != key
            || ns
                .as_ref()
                .is_some_and(|n| info2.namespaced && *n != e.namespace)
        {
            return None;
        }
        let sel = |o: &Value| labels.matches(o) && fields.matches(o);
        let now = sel(&e.object);
        match (e.kind, e.previous.as_deref().map(sel)) {
            (EventType::Modified, Some(false)) if now => Some("ADDED"),
            (EventType::Modified, Some(true)) if !now => Some("DELETED"),
            _ if now => Some(e.kind.as_str()),
            _ => None,
        }
    };
    let render = move |ty: &str, e: &Event| -> Bytes {
        if table {
            let t = to_table(
                &info,
                std::slice::from_ref(&e.object),
                e.rv,
                &Query(Vec::new()),
            );
            event_line(ty, &t)
        } else {
            // Rendered once per event and shared by every watcher.
            e.line(ty)
        }
    };
    let mut stop = shared.stop.clone();
    tokio::spawn(async move {
        if *stop.borrow_and_update() {
            return;
        }
        let deadline = timeout.map(|t| tokio::time::Instant::now() + Duration::from_secs(t));
        for e in &replay {
            if let Some(ty) = matches(e) {
                if tx.send(render(ty, e)).await.is_err() {
                    return;
                }
            }
        }
        if initial_events_end {
            let b = json!({"kind": kind, "apiVersion": api_version,
                "metadata": {"resourceVersion": last_rv.to_string(),
                    "annotations": {"k8s.io/initial-events-end": "true"}}});
            if tx.send(event_line("BOOKMARK", &b)).await.is_err() {
                return;
            }
        }
        let mut tick = tokio::time::interval(interval);
        tick.tick().await;
        loop {
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = sub.recv() => match r {
                    Ok(e) => {
                        if e.rv <= last_rv {
                            // Already sent from the history after a lag.
                            continue;
                        }
                        last_rv = e.rv;
                        if let Some(ty) = matches(&e) {
                            if tx.send(render(ty, &e)).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        // The live channel moved on: catch up from the history while it reaches
                        // back far enough, as the real server does from its watch cache.
                        let Some(missed) = store_ref.store.history_after(&info3, last_rv) else {
                            let e = Error::gone("the watch fell behind; relist");
                            let _ = tx.send(event_line("ERROR", &e.to_status())).await;
                            return;
                        };
                        for e in &missed {
                            last_rv = last_rv.max(e.rv);
                            if let Some(ty) = matches(e) {
                                if tx.send(render(ty, e)).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tick.tick(), if bookmarks => {
                    let b = json!({"kind": kind, "apiVersion": api_version,
                        "metadata": {"resourceVersion": last_rv.to_string()}});
                    if tx.send(event_line("BOOKMARK", &b)).await.is_err() {
                        return;
                    }
                }
                _ = sleep => return,
                _ = tx.closed() => return,
                _ = stop.changed() => return,
            }
        }
    });
    Ok(resp)
}
