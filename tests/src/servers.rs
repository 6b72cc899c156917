//! The servers a test stands up or borrows: HTTP receivers, a schema of
//! its own on the machine's PostgreSQL, a TCP proxy it can cut.

use serde_json::Value;

/// An HTTP server on a free local port that answers every request 200 and
/// hands over its head and JSON body.
pub fn http_receiver() -> (u16, std::sync::mpsc::Receiver<(String, Value)>) {
    use std::io::{BufRead, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut r = std::io::BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            let mut len = 0;
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
                head.push_str(&line);
            }
            let mut body = vec![0; len];
            let _ = r.read_exact(&mut body);
            let mut w = stream;
            let _ = w.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            let _ = tx.send((head, serde_json::from_slice(&body).unwrap_or(Value::Null)));
        }
    });
    (port, rx)
}

/// An HTTP server on a free local port that answers every request with
/// this status line (`501 Not Implemented`), content type and body.
pub fn http_responder(status: &str, content_type: &str, body: &str) -> u16 {
    use std::io::{BufRead, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let answer = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut r = std::io::BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while r.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                line.clear();
            }
            let _ = (&stream).write_all(answer.as_bytes());
        }
    });
    port
}

/// The PostgreSQL the tests use: `APOLLO_TEST_DATABASE_URL`, default the
/// machine's server at 127.0.0.1:5432 (trust auth, database `test`).
pub fn pg_url() -> String {
    std::env::var("APOLLO_TEST_DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A schema of a test's own on the test PostgreSQL, dropped when this is.
pub struct PgSchema {
    pub name: String,
}

impl PgSchema {
    /// A fresh, empty schema name for `test` (the schema is created by the
    /// first agent that opens it).
    pub fn new(test: &str) -> PgSchema {
        let s = PgSchema { name: format!("apollo_e2e_{test}_{}", std::process::id()) };
        s.sql(&format!("DROP SCHEMA IF EXISTS {} CASCADE", s.name));
        s
    }

    /// The `database:` section that puts an agent on this schema.
    pub fn config(&self) -> String {
        format!("database:\n  url: {}\n  schema: {}\n", pg_url(), self.name)
    }

    /// Runs SQL (with the schema on the search path); the rows as text.
    pub fn sql(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        let (url, sql) = (pg_url(), format!("SET search_path TO {}; {sql}", self.name));
        std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap_or_else(|e| {
                panic!(
                    "PostgreSQL at {url} is unreachable ({e}); start it, or point APOLLO_TEST_DATABASE_URL elsewhere"
                )
            });
            let mut out = Vec::new();
            for m in c.simple_query(&sql).unwrap() {
                if let postgres::SimpleQueryMessage::Row(r) = m {
                    out.push((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect());
                }
            }
            out
        })
        .join()
        .unwrap()
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        self.sql(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name));
    }
}

/// A TCP proxy in front of a server that a test can cut (every connection
/// closed, new ones refused) and restore.
pub struct Proxy {
    pub port: u16,
    up: std::sync::Arc<std::sync::atomic::AtomicBool>,
    open: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

impl Proxy {
    pub fn start(to: std::net::SocketAddr) -> Proxy {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let open = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (u, o) = (up.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                // Checked and registered under the lock `cut` takes: a
                // connection accepted while the proxy is cut never outlives
                // the cut.
                let mut open = o.lock().unwrap();
                if !u.load(Ordering::SeqCst) {
                    continue; // refused: dropped at once
                }
                let Ok(server) = std::net::TcpStream::connect(to) else { continue };
                open.push(client.try_clone().unwrap());
                open.push(server.try_clone().unwrap());
                for (mut from, mut into) in
                    [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)]
                {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut into);
                        let _ = into.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Proxy { port, up, open }
    }

    pub fn cut(&self) {
        let mut open = self.open.lock().unwrap();
        self.up.store(false, std::sync::atomic::Ordering::SeqCst);
        for s in open.drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn restore(&self) {
        self.up.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
