//! The job's small HTTP/1.1 server: `/metrics` (the Prometheus text of
//! every spate figure), `/` (the web page, one self-contained file with no
//! external asset) and `/api/status` (the JSON the page polls).
//!
//! It is deliberately small: std's sockets, a thread that accepts and one
//! short-lived thread per connection (at most [`MAX_CONNECTIONS`] at once),
//! `GET` (and `HEAD`) only, a request head of at most [`MAX_HEAD_BYTES`],
//! one request per connection (`Connection: close`), 404 for any other
//! path. It binds where it is told; `127.0.0.1` keeps it on this machine.
//!
//! A connection has [`CONNECTION_DEADLINE`] from its accept to the end of
//! its answer, whatever pace the client sends at: a client trickling a
//! byte at a time cannot hold one of the few slots for long. A request
//! whose `Host` is a name other than `localhost` is refused with 421, so a
//! page of another site whose name was rebound to this machine's address
//! (DNS rebinding) cannot read the status through the browser.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;
use tracing::{debug, warn};

use crate::error::RuntimeError;
use crate::status::{StatusBoard, lag_from_metrics};
use crate::telemetry;

/// The largest request head (request line and headers) read; a longer one is refused.
pub(crate) const MAX_HEAD_BYTES: usize = 8 << 10;
/// Connections served at once; more are closed at once.
pub(crate) const MAX_CONNECTIONS: usize = 32;
/// How long a connection may take, from its accept to the end of its
/// answer: sending the request and reading the answer together.
pub(crate) const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);

/// How long, and how much, a closing connection's leftover input is read
/// (in all, not per read).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);
const DRAIN_BYTES: u64 = 1 << 20;

/// The first pause after a failed accept, and the longest: a failing
/// accept (out of file descriptors) is retried at a slowing pace instead
/// of in a busy loop.
const ACCEPT_PAUSE_FIRST: Duration = Duration::from_millis(10);
const ACCEPT_PAUSE_MAX: Duration = Duration::from_secs(1);

/// The web page: one file, its CSS and JavaScript inline.
const PAGE: &str = include_str!("ui.html");
/// The web page of a process running several jobs (a member's tasks).
const PROCESS_PAGE: &str = include_str!("process.html");

/// What a server answers.
#[derive(Clone, Default)]
pub(crate) struct Routes {
    /// `/metrics`, rendered from this recorder.
    pub(crate) metrics: Option<PrometheusHandle>,
    /// `/` and `/api/status`, from this board (the lag comes from `metrics` when set).
    pub(crate) ui: Option<(Arc<StatusBoard>, Option<PrometheusHandle>)>,
    /// `/` and `/api/status` of a process running several jobs: the page
    /// of its jobs, and the JSON this gives.
    pub(crate) process: Option<crate::process_server::ProcessStatus>,
}

/// A running server; dropping it stops it.
pub(crate) struct HttpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for HttpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpServer").field("addr", &self.addr).finish_non_exhaustive()
    }
}

/// What each connection's thread needs: the routes, the address the
/// server is bound to (for the `Host` check) and the connection deadline.
struct Served {
    routes: Routes,
    bound: SocketAddr,
    deadline: Duration,
}

impl HttpServer {
    /// Binds `addr` (port 0: any free port) and serves `routes` on a thread.
    pub(crate) fn start(addr: SocketAddr, routes: Routes) -> Result<Self, RuntimeError> {
        Self::start_with_deadline(addr, routes, CONNECTION_DEADLINE)
    }

    /// [`HttpServer::start`], each connection given `deadline` instead of
    /// [`CONNECTION_DEADLINE`] (a tiny one in tests).
    pub(crate) fn start_with_deadline(
        addr: SocketAddr,
        routes: Routes,
        deadline: Duration,
    ) -> Result<Self, RuntimeError> {
        let setting = || "metrics_addr/ui_addr".to_string();
        let listener = TcpListener::bind(addr).map_err(|e| RuntimeError::InvalidSetting {
            setting: setting(),
            reason: format!("cannot listen on {addr}: {e}"),
        })?;
        let addr = listener.local_addr().map_err(|e| RuntimeError::io("read the address of", addr.to_string(), e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(Served { routes, bound: addr, deadline });
        let stopping = Arc::clone(&stop);
        let acceptor = std::thread::Builder::new()
            .name("spate-http".into())
            .spawn(move || accept_loop(&listener, &served, &stopping))
            .map_err(|e| RuntimeError::Lifecycle { what: format!("could not start the HTTP server: {e}") })?;
        Ok(HttpServer { addr, stop, acceptor: Some(acceptor) })
    }

    /// The address it listens on (with the port chosen when asked for port 0).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the blocking accept with a connection of our own.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(if wake.is_ipv4() { Ipv4Addr::LOCALHOST.into() } else { Ipv6Addr::LOCALHOST.into() });
        }
        if TcpStream::connect_timeout(&wake, Duration::from_secs(1)).is_ok()
            && let Some(acceptor) = self.acceptor.take()
        {
            let _ = acceptor.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, served: &Arc<Served>, stop: &AtomicBool) {
    let active = Arc::new(AtomicUsize::new(0));
    let handle = |stream: TcpStream| {
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::AcqRel);
            // Too many at once: closed unanswered.
            return;
        }
        let (served, done) = (Arc::clone(served), Arc::clone(&active));
        let spawned = std::thread::Builder::new().name("spate-http-conn".into()).spawn(move || {
            if let Err(e) = serve(stream, &served) {
                debug!(error = %e, "an HTTP connection failed");
            }
            done.fetch_sub(1, Ordering::AcqRel);
        });
        if let Err(e) = spawned {
            active.fetch_sub(1, Ordering::AcqRel);
            warn!(error = %e, "could not start a thread for an HTTP connection");
        }
    };
    accept_each(listener.incoming(), stop, handle, std::thread::sleep);
}

/// Hands each accepted connection to `handle` until `stop` is set. After a
/// failed accept it `pause`s, longer after each failure in a row: an accept
/// that keeps failing (the process out of file descriptors) would otherwise
/// spin a core.
pub(crate) fn accept_each(
    incoming: impl Iterator<Item = io::Result<TcpStream>>,
    stop: &AtomicBool,
    mut handle: impl FnMut(TcpStream),
    mut pause: impl FnMut(Duration),
) {
    let mut next_pause = ACCEPT_PAUSE_FIRST;
    for stream in incoming {
        if stop.load(Ordering::Acquire) {
            return;
        }
        match stream {
            Ok(stream) => {
                next_pause = ACCEPT_PAUSE_FIRST;
                handle(stream);
            }
            Err(e) => {
                // Said once a streak: a failing accept would otherwise fill the log.
                if next_pause == ACCEPT_PAUSE_FIRST {
                    warn!(error = %e, "accepting an HTTP connection failed; retrying at a slowing pace");
                } else {
                    debug!(error = %e, pause_ms = next_pause.as_millis(), "accepting an HTTP connection failed");
                }
                pause(next_pause);
                next_pause = (next_pause * 2).min(ACCEPT_PAUSE_MAX);
            }
        }
    }
}

/// Answers the one request of a connection, all within the deadline.
fn serve(stream: TcpStream, served: &Served) -> io::Result<()> {
    let mut conn = Bounded::new(stream, Deadline::after(served.deadline));
    let response = match read_head(&mut conn) {
        Ok(head) => match parse_request(&head) {
            Ok(request) if !host_allowed(request.host.as_deref(), served.bound) => {
                debug!(host = ?request.host, "refused a request for another host");
                Response::error(Status::MisdirectedRequest)
            }
            Ok(request) => respond(&request, &served.routes),
            Err(status) => Response::error(status),
        },
        Err(HeadError::TooLarge) => Response::error(Status::HeaderTooLarge),
        Err(HeadError::Closed) => return Ok(()),
        Err(HeadError::Io(e)) => return Err(e),
    };
    conn.write_all(&response.to_bytes())?;
    conn.flush()?;
    // Closing with unread bytes (the rest of an oversize head) would reset
    // the connection and could lose the answer on the way: end the writing
    // side, then read what the peer still sends, within bounds.
    conn.stream.shutdown(std::net::Shutdown::Write)?;
    let mut drain = Bounded::new(conn.stream, Deadline::after(DRAIN_TIMEOUT));
    let _ = io::copy(&mut Read::take(&mut drain, DRAIN_BYTES), &mut io::sink());
    Ok(())
}

/// The moment a connection's time is up, and the clock it is read on
/// (the monotonic clock; a stepped one in tests).
pub(crate) struct Deadline {
    at: Instant,
    now: Box<dyn FnMut() -> Instant + Send>,
}

impl Deadline {
    /// `limit` from now.
    pub(crate) fn after(limit: Duration) -> Self {
        Deadline { at: Instant::now() + limit, now: Box::new(Instant::now) }
    }

    /// The time left; a `TimedOut` error once there is none.
    fn left(&mut self) -> io::Result<Duration> {
        let left = self.at.saturating_duration_since((self.now)());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "the connection's deadline passed"));
        }
        Ok(left)
    }
}

/// A stream whose blocking reads and writes can be cut short.
pub(crate) trait Timeouts {
    /// Makes the next reads and writes give up after `limit`.
    fn set_timeouts(&self, limit: Duration) -> io::Result<()>;
}

impl Timeouts for TcpStream {
    fn set_timeouts(&self, limit: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(limit))?;
        self.set_write_timeout(Some(limit))
    }
}

/// A connection every read and write of which ends by one deadline: each
/// may block only for the time left, so the deadline bounds the whole
/// exchange rather than each read.
pub(crate) struct Bounded<S> {
    stream: S,
    deadline: Deadline,
}

impl<S: Timeouts> Bounded<S> {
    pub(crate) fn new(stream: S, deadline: Deadline) -> Self {
        Bounded { stream, deadline }
    }

    /// Limits the next blocking call to the time left.
    fn arm(&mut self) -> io::Result<()> {
        let left = self.deadline.left()?;
        self.stream.set_timeouts(left)
    }
}

impl<S: Read + Timeouts> Read for Bounded<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.arm()?;
        self.stream.read(buf)
    }
}

impl<S: Write + Timeouts> Write for Bounded<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.arm()?;
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.arm()?;
        self.stream.flush()
    }
}

/// Whether a request's `Host` names this server in a way no other site
/// can: `localhost`, or an IP address (this server's, or a loopback one;
/// any, when it is bound to all addresses), with the server's port. A
/// page whose own name was rebound to this machine (DNS rebinding) sends
/// its name, and is refused. A request without `Host` (not a browser's)
/// is served.
pub(crate) fn host_allowed(host: Option<&str>, bound: SocketAddr) -> bool {
    let Some(host) = host else { return true };
    let (name, port) = split_host(host);
    if port.unwrap_or(80) != bound.port() {
        return false;
    }
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    match name.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback() || ip == bound.ip() || bound.ip().is_unspecified(),
        Err(_) => false,
    }
}

/// `name` and `port` of a `Host` value: `name:port`, `[v6]:port`, or
/// either without its port (`None`; an unreadable port is `Some(0)`, which
/// no server is bound to).
fn split_host(host: &str) -> (&str, Option<u16>) {
    let port = |text: &str| Some(text.parse::<u16>().unwrap_or(0));
    if let Some(rest) = host.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((ip, "")) => (ip, None),
            Some((ip, tail)) => (ip, tail.strip_prefix(':').map_or(Some(0), port)),
            None => (host, Some(0)),
        };
    }
    match host.rsplit_once(':') {
        Some((name, tail)) => (name, port(tail)),
        None => (host, None),
    }
}

/// Why no request head could be read.
#[derive(Debug)]
pub(crate) enum HeadError {
    /// Past [`MAX_HEAD_BYTES`] without the blank line that ends a head.
    TooLarge,
    /// The peer closed before a whole head.
    Closed,
    /// The socket failed (a timeout included).
    Io(io::Error),
}

/// Reads up to the blank line ending the request head, refusing a head
/// longer than [`MAX_HEAD_BYTES`]. A request body (none is expected) is not read.
pub(crate) fn read_head(reader: &mut impl Read) -> Result<Vec<u8>, HeadError> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Err(HeadError::Closed),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(HeadError::Io(e)),
        };
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            head.truncate(end);
            return Ok(head);
        }
        if head.len() > MAX_HEAD_BYTES {
            return Err(HeadError::TooLarge);
        }
    }
}

/// A parsed request: the method, the path (without its query) and the
/// `Host` header's value.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) host: Option<String>,
}

/// Parses a request head: `METHOD SP TARGET SP HTTP/1.x`, then headers, of
/// which only `Host` is read (two of them are refused).
pub(crate) fn parse_request(head: &[u8]) -> Result<Request, Status> {
    let text = std::str::from_utf8(head).map_err(|_| Status::BadRequest)?;
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Status::BadRequest);
    };
    if !version.starts_with("HTTP/1.") || method.is_empty() || !target.starts_with('/') {
        return Err(Status::BadRequest);
    }
    let path = target.split(['?', '#']).next().unwrap_or(target);
    let mut host = None;
    for header in lines {
        let Some((name, value)) = header.split_once(':') else { continue };
        if name.trim().eq_ignore_ascii_case("host") && host.replace(value.trim().to_string()).is_some() {
            return Err(Status::BadRequest);
        }
    }
    Ok(Request { method: method.to_string(), path: path.to_string(), host })
}

/// The statuses this server answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Ok,
    BadRequest,
    NotFound,
    MethodNotAllowed,
    MisdirectedRequest,
    HeaderTooLarge,
    InternalError,
}

impl Status {
    fn line(self) -> &'static str {
        match self {
            Status::Ok => "200 OK",
            Status::BadRequest => "400 Bad Request",
            Status::NotFound => "404 Not Found",
            Status::MethodNotAllowed => "405 Method Not Allowed",
            Status::MisdirectedRequest => "421 Misdirected Request",
            Status::HeaderTooLarge => "431 Request Header Fields Too Large",
            Status::InternalError => "500 Internal Server Error",
        }
    }
}

/// A response: status, content type, body; `HEAD` drops the body but keeps its length.
#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: Status,
    pub(crate) content_type: &'static str,
    pub(crate) body: Vec<u8>,
    head_only: bool,
}

impl Response {
    fn ok(content_type: &'static str, body: impl Into<Vec<u8>>) -> Self {
        Response { status: Status::Ok, content_type, body: body.into(), head_only: false }
    }

    fn error(status: Status) -> Self {
        let body = format!("{}\n", status.line());
        Response { status, content_type: "text/plain; charset=utf-8", body: body.into_bytes(), head_only: false }
    }

    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n\
             X-Content-Type-Options: nosniff\r\nConnection: close\r\n",
            self.status.line(),
            self.content_type,
            self.body.len()
        );
        if self.status == Status::MethodNotAllowed {
            out.push_str("Allow: GET, HEAD\r\n");
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        if !self.head_only {
            bytes.extend_from_slice(&self.body);
        }
        bytes
    }
}

/// The answer to `request`.
pub(crate) fn respond(request: &Request, routes: &Routes) -> Response {
    let head_only = request.method == "HEAD";
    if request.method != "GET" && !head_only {
        return Response::error(Status::MethodNotAllowed);
    }
    let mut response = match (request.path.as_str(), &routes.metrics, &routes.ui) {
        ("/metrics", Some(handle), _) => {
            Response::ok("text/plain; version=0.0.4; charset=utf-8", telemetry::render(handle))
        }
        ("/", _, Some(_)) => Response::ok("text/html; charset=utf-8", PAGE),
        ("/", _, None) if routes.process.is_some() => Response::ok("text/html; charset=utf-8", PROCESS_PAGE),
        ("/api/status", _, None) if routes.process.is_some() => {
            let status = routes.process.as_ref().map(|status| status()).unwrap_or_default();
            match serde_json::to_vec(&status) {
                Ok(json) => Response::ok("application/json", json),
                Err(e) => {
                    warn!(error = %e, "encoding the status failed");
                    Response::error(Status::InternalError)
                }
            }
        }
        ("/api/status", _, Some((board, handle))) => {
            let lag = handle.as_ref().map(|h| lag_from_metrics(&telemetry::render(h))).unwrap_or_else(BTreeMap::new);
            match serde_json::to_vec(&board.snapshot(&lag)) {
                Ok(json) => Response::ok("application/json", json),
                Err(e) => {
                    warn!(error = %e, "encoding the status failed");
                    Response::error(Status::InternalError)
                }
            }
        }
        _ => Response::error(Status::NotFound),
    };
    response.head_only = head_only;
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_exporter_prometheus::PrometheusBuilder;
    use spate_core::{BatchId, Time};

    fn get(addr: SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.write_all(request).unwrap();
        stream.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    }

    #[test]
    fn request_lines_parse_and_malformed_ones_are_refused() {
        let request = parse_request(b"GET /api/status?x=1 HTTP/1.1\r\nHOST:  h:1 ").unwrap();
        assert_eq!(request, Request { method: "GET".into(), path: "/api/status".into(), host: Some("h:1".into()) });
        assert_eq!(parse_request(b"GET / HTTP/1.0").unwrap().path, "/");
        assert_eq!(parse_request(b"GET / HTTP/1.1\r\nHost: a\r\nhost: b"), Err(Status::BadRequest));
        for bad in
            [&b"GET /"[..], b"GET / HTTP/1.1 extra", b"GET http://x/ HTTP/1.1", b"GET / SPDY/3", b"\xff / HTTP/1.1"]
        {
            assert_eq!(parse_request(bad), Err(Status::BadRequest), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_head_is_read_to_its_blank_line_and_an_oversize_one_is_refused() {
        let mut ok = io::Cursor::new(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nbody".to_vec());
        assert_eq!(read_head(&mut ok).unwrap(), b"GET / HTTP/1.1\r\nHost: x");
        let mut endless = io::Cursor::new(vec![b'a'; MAX_HEAD_BYTES + 2048]);
        assert!(matches!(read_head(&mut endless), Err(HeadError::TooLarge)));
        let mut cut = io::Cursor::new(b"GET / HTTP/1.1\r\n".to_vec());
        assert!(matches!(read_head(&mut cut), Err(HeadError::Closed)));
    }

    #[test]
    fn only_the_routes_asked_for_are_served_and_other_methods_are_refused() {
        let metrics_only =
            Routes { metrics: Some(PrometheusBuilder::new().build_recorder().handle()), ..Routes::default() };
        let get = |path: &str| Request { method: "GET".into(), path: path.into(), host: None };
        assert_eq!(respond(&get("/metrics"), &metrics_only).status, Status::Ok);
        assert_eq!(respond(&get("/"), &metrics_only).status, Status::NotFound);
        assert_eq!(respond(&get("/api/status"), &metrics_only).status, Status::NotFound);
        let board = Arc::new(StatusBoard::new(1000));
        let ui_only = Routes { ui: Some((board, None)), ..Routes::default() };
        assert_eq!(respond(&get("/metrics"), &ui_only).status, Status::NotFound);
        let page = respond(&get("/"), &ui_only);
        assert_eq!((page.status, page.content_type), (Status::Ok, "text/html; charset=utf-8"));
        let post = Request { method: "POST".into(), path: "/".into(), host: None };
        let refused = respond(&post, &ui_only);
        assert_eq!(refused.status, Status::MethodNotAllowed);
        assert!(String::from_utf8_lossy(&refused.to_bytes()).contains("Allow: GET, HEAD\r\n"));
        let head = respond(&Request { method: "HEAD".into(), path: "/".into(), host: None }, &ui_only).to_bytes();
        let head = String::from_utf8(head).unwrap();
        assert!(head.ends_with("\r\n\r\n") && head.contains(&format!("Content-Length: {}", PAGE.len())), "{head}");
    }

    #[test]
    fn the_page_is_self_contained() {
        for external in ["src=\"http", "href=\"http", "src=\"//", "href=\"//", "@import", "<link"] {
            assert!(!PAGE.contains(external), "the page loads something from elsewhere: {external}");
        }
        assert!(PAGE.contains("/api/status"));
    }

    #[test]
    fn a_server_on_port_0_answers_status_404_and_refuses_an_oversize_head() {
        let board = Arc::new(StatusBoard::new(500));
        board.batch_started(BatchId(7), Time::from_millis(3500), 2, false);
        let routes = Routes { ui: Some((Arc::clone(&board), None)), ..Routes::default() };
        let server = HttpServer::start("127.0.0.1:0".parse().unwrap(), routes).unwrap();
        let addr = server.addr();
        assert_ne!(addr.port(), 0);
        let status = get(addr, format!("GET /api/status HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes());
        assert!(status.starts_with("HTTP/1.1 200 OK\r\n") && status.contains("Connection: close\r\n"), "{status}");
        let body = status.split_once("\r\n\r\n").unwrap().1;
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["batch_interval_ms"], 500);
        assert_eq!(json["batches"][0]["batch_id"], 7);
        assert_eq!(json["batches"][0]["committed"], false);
        assert!(get(addr, b"GET /nothing HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 Not Found\r\n"));
        let mut oversize = b"GET / HTTP/1.1\r\nX-Filler: ".to_vec();
        oversize.extend(std::iter::repeat_n(b'a', MAX_HEAD_BYTES * 2));
        oversize.extend_from_slice(b"\r\n\r\n");
        // The server answers before reading all of it, so writing the rest may fail.
        let mut stream = TcpStream::connect(addr).unwrap();
        let _ = stream.write_all(&oversize);
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
        drop(server);
        assert!(TcpStream::connect(addr).is_err(), "the server still listens after it was dropped");
    }

    /// Ui routes on a fresh board.
    fn ui_routes() -> Routes {
        Routes { ui: Some((Arc::new(StatusBoard::new(500)), None)), ..Routes::default() }
    }

    /// A stream handing out its bytes one at a time, as a client trickling them would.
    struct Trickle(io::Cursor<Vec<u8>>);

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let one = buf.len().min(1);
            self.0.read(&mut buf[..one])
        }
    }

    impl Timeouts for Trickle {
        fn set_timeouts(&self, _limit: Duration) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_client_trickling_its_request_is_cut_off_at_the_deadline_of_the_whole_connection() {
        // Each look at the clock finds it 9 s later: every read comes well
        // within a per-read timeout of 10 s, the whole request does not.
        let start = Instant::now();
        let mut looks = 0u32;
        let clock = move || {
            looks += 1;
            start + Duration::from_secs(9) * looks
        };
        let deadline = Deadline { at: start + CONNECTION_DEADLINE, now: Box::new(clock) };
        let request = b"GET /api/status HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec();
        let mut conn = Bounded::new(Trickle(io::Cursor::new(request)), deadline);
        match read_head(&mut conn) {
            Err(HeadError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}"),
            other => panic!("the trickled request was read whole: {other:?}"),
        }
    }

    #[test]
    fn a_connection_past_its_deadline_is_closed_unanswered() {
        // A deadline of zero has passed by the first read: the request,
        // complete and valid, is never answered.
        let server =
            HttpServer::start_with_deadline("127.0.0.1:0".parse().unwrap(), ui_routes(), Duration::ZERO).unwrap();
        let addr = server.addr();
        let mut stream = TcpStream::connect(addr).unwrap();
        let _ = stream.write_all(format!("GET /api/status HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes());
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        assert!(answer.is_empty(), "answered: {}", String::from_utf8_lossy(&answer));
    }

    #[test]
    fn a_failing_accept_pauses_longer_each_time_instead_of_spinning() {
        let failures = (0..12).map(|_| Err(io::Error::other("too many open files")));
        let mut pauses = Vec::new();
        accept_each(failures, &AtomicBool::new(false), |_| unreachable!(), |d| pauses.push(d));
        assert_eq!(pauses.len(), 12, "one pause per failed accept");
        assert_eq!(pauses[0], ACCEPT_PAUSE_FIRST);
        assert!(pauses.windows(2).all(|w| w[1] >= w[0]), "{pauses:?}");
        assert_eq!(*pauses.last().unwrap(), ACCEPT_PAUSE_MAX, "{pauses:?}");
    }

    #[test]
    fn a_request_for_another_host_is_refused_so_a_rebound_name_cannot_read_the_status() {
        let server = HttpServer::start("127.0.0.1:0".parse().unwrap(), ui_routes()).unwrap();
        let (addr, port) = (server.addr(), server.addr().port());
        let status_for = |host: &str| {
            let answer = get(addr, format!("GET /api/status HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes());
            answer.split("\r\n").next().unwrap_or_default().to_string()
        };
        for refused in [
            format!("evil.example:{port}"),
            format!("localhost.evil.example:{port}"),
            format!("127.0.0.1.nip.io:{port}"),
            format!("localhost:{}", port.wrapping_add(1)),
            "localhost".to_string(),
            format!("127.0.0.1:{port}x"),
        ] {
            assert_eq!(status_for(&refused), "HTTP/1.1 421 Misdirected Request", "Host: {refused}");
        }
        for served in
            [format!("{addr}"), format!("localhost:{port}"), format!("LOCALHOST:{port}"), format!("[::1]:{port}")]
        {
            assert_eq!(status_for(&served), "HTTP/1.1 200 OK", "Host: {served}");
        }
    }

    #[test]
    fn on_all_addresses_any_ip_with_the_port_is_this_server_but_no_other_name() {
        let all: SocketAddr = "0.0.0.0:9464".parse().unwrap();
        assert!(host_allowed(Some("10.1.2.3:9464"), all));
        assert!(host_allowed(Some("[fe80::1]:9464"), all));
        assert!(!host_allowed(Some("10.1.2.3:9465"), all));
        assert!(!host_allowed(Some("metrics.example:9464"), all));
        let one: SocketAddr = "10.1.2.3:80".parse().unwrap();
        assert!(host_allowed(Some("10.1.2.3"), one), "no port is port 80");
        assert!(!host_allowed(Some("10.9.9.9"), one), "another machine's address");
        assert!(host_allowed(None, one), "no Host: not a browser");
    }
}
