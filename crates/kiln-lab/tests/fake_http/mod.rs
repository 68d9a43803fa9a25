//! A one-thread HTTP/1.1 server on loopback for tests that stand in for a remote API (the
//! served model, the hub's datasets API): each request is read whole and answered with JSON.
#![allow(dead_code)] // each test binary reads only the fields it needs

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;

/// One request as the handler sees it.
pub struct Request {
    /// The path with its query.
    pub path: String,
    /// The `Authorization` header ("" when absent).
    pub authorization: String,
    /// The body.
    pub body: Vec<u8>,
}

/// Serves `answer` on a fresh loopback port until the test process ends; returns the base URL.
pub fn serve(answer: impl Fn(Request) -> String + Send + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let Some(req) = read(&stream) else { continue };
            let body = answer(req);
            let mut s = stream;
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

fn read(stream: &std::net::TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let (mut authorization, mut len) = (String::new(), 0usize);
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 || h == "\r\n" {
            break;
        }
        let (name, value) = h.split_once(':')?;
        match name.to_ascii_lowercase().as_str() {
            "authorization" => authorization = value.trim().to_string(),
            "content-length" => len = value.trim().parse().ok()?,
            _ => {}
        }
    }
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    let path = line.split_whitespace().nth(1)?.to_string();
    Some(Request {
        path,
        authorization,
        body,
    })
}
