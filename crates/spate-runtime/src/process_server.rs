//! The HTTP server of a process that runs several jobs, such as a member
//! of an application whose tasks are each a streaming context: one
//! `/metrics` for the whole process (each job's batch figures carry its
//! [`crate::StreamingSettings::metric_labels`]) and one page of its jobs,
//! whose `/api/status` is whatever JSON the process gives.
//!
//! The jobs of such a process serve nothing themselves: they come and go
//! (a task moves to another member), while the process's addresses stay.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::error::RuntimeError;
use crate::http::{HttpServer, Routes};
use crate::telemetry;

/// The JSON of a process's `/api/status`, asked at each request.
pub type ProcessStatus = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// A running server of a process; dropping it stops it.
#[derive(Debug)]
pub struct ProcessServer {
    server: HttpServer,
}

impl ProcessServer {
    /// Binds `addr` (port 0: any free port) and serves `/metrics` when
    /// `metrics` (installing spate's Prometheus recorder as the process's,
    /// once per process) and the page of `status` when one is given.
    pub fn start(addr: SocketAddr, metrics: bool, status: Option<ProcessStatus>) -> Result<Self, RuntimeError> {
        let metrics = if metrics { Some(telemetry::exporter()?) } else { None };
        let routes = Routes { metrics, ui: None, process: status };
        Ok(ProcessServer { server: HttpServer::start(addr, routes)? })
    }

    /// The address it listens on (with the port chosen when asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use super::*;

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = TcpStream::connect(addr).unwrap();
        write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    }

    #[test]
    fn the_page_and_the_status_of_the_process_are_served() {
        let status: ProcessStatus = Arc::new(|| serde_json::json!({"tasks": [{"task": "count/words-0"}]}));
        let server = ProcessServer::start("127.0.0.1:0".parse().unwrap(), false, Some(status)).unwrap();
        let page = get(server.addr(), "/");
        assert!(page.starts_with("HTTP/1.1 200") && page.contains("/api/status"), "{page}");
        let json = get(server.addr(), "/api/status");
        assert!(json.contains("count/words-0"), "{json}");
        assert!(get(server.addr(), "/metrics").starts_with("HTTP/1.1 404"), "no metrics asked for");
    }
}
