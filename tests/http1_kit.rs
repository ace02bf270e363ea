//! The HTTP/1.1 kit (`tests/support/http1.rs`) on its own: framing round trips without a
//! network. Here rather than inside the kit so they run once, not in every test binary that
//! includes `support`.

#[path = "support/http1.rs"]
mod http1;

use http1::*;
use std::io;

#[test]
fn chunked_request_round_trip() {
    let mut wire = Vec::new();
    wire.extend_from_slice(
        b"POST /v1/x?y=1 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
    );
    write_chunk(&mut wire, b"hello ").unwrap();
    write_chunk(&mut wire, b"world").unwrap();
    write_last_chunk(&mut wire).unwrap();
    write_request(&mut wire, "GET", "/metrics", &[("host", "a")], b"").unwrap();
    let mut reader = io::Cursor::new(wire);
    let first = read_request(&mut reader).unwrap().unwrap();
    assert_eq!((first.method.as_str(), first.path()), ("POST", "/v1/x"));
    assert_eq!(first.header("HOST"), Some("a"));
    assert_eq!(first.body, b"hello world");
    let second = read_request(&mut reader).unwrap().unwrap();
    assert_eq!((second.target.as_str(), second.body.len()), ("/metrics", 0));
    assert!(read_request(&mut reader).unwrap().is_none());
}

#[test]
fn responses_by_length_chunks_and_close() {
    let mut wire = Vec::new();
    write_response(&mut wire, 404, &[("x-a", "1")], b"nope").unwrap();
    write_chunked_head(&mut wire, 200, &[("content-type", "text/event-stream")]).unwrap();
    write_chunk(&mut wire, b"data: 1\n\n").unwrap();
    write_chunk(&mut wire, b"").unwrap();
    write_chunk(&mut wire, b"data: 2\n\n").unwrap();
    write_last_chunk(&mut wire).unwrap();
    wire.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\nrest of stream");
    let mut reader = io::Cursor::new(wire);
    let first = read_response(&mut reader).unwrap();
    assert_eq!((first.status, first.text().as_str()), (404, "nope"));
    assert_eq!(first.header("X-A"), Some("1"));
    let (status, headers) = read_response_head(&mut reader).unwrap();
    let mut pieces = 0;
    let body = read_body(&mut reader, Framing::of(&headers), &mut |_| pieces += 1).unwrap();
    assert_eq!((status, pieces), (200, 2));
    assert_eq!(body, b"data: 1\n\ndata: 2\n\n");
    let last = read_response(&mut reader).unwrap();
    assert_eq!(last.text(), "rest of stream");
}

#[test]
fn bad_chunk_size_is_an_error() {
    let wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n".to_vec();
    assert!(read_response(&mut io::Cursor::new(wire)).is_err());
}

#[test]
fn keep_alive_client_and_server_over_loopback() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let server = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut served = 0;
        serve(&stream, |request, out| {
            served += 1;
            if request.path() == "/stream" {
                write_chunked_head(out, 200, &[]).unwrap();
                write_chunk(out, b"one ").unwrap();
                write_chunk(out, &request.body).unwrap();
                write_last_chunk(out).unwrap();
            } else {
                let body = format!("{} {}", request.method, served);
                write_response(out, 200, &[("x-n", "1")], body.as_bytes()).unwrap();
            }
            true
        });
        served
    });
    let timeout = std::time::Duration::from_secs(5);
    let mut client = Client::connect(&address, timeout).unwrap();
    let first = client
        .send("GET", "/a", &[("host", "x")], b"", &mut |_| {})
        .unwrap();
    assert_eq!(first.text(), "GET 1");
    let mut pieces = Vec::new();
    let second = client
        .send("POST", "/stream", &[("host", "x")], b"two", &mut |p| {
            pieces.push(p.to_vec())
        })
        .unwrap();
    assert_eq!(second.text(), "one two");
    assert_eq!(pieces, [b"one ".to_vec(), b"two".to_vec()]);
    assert!(!client.is_closed());
    // `exchange` on a fresh connection asks the server to close after it.
    drop(client);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address2 = listener.local_addr().unwrap().to_string();
    let closer = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut seen = Vec::new();
        serve(&stream, |request, out| {
            seen.push(request.header("connection").unwrap_or("").to_string());
            write_response(out, 204, &[], b"").is_ok()
        });
        seen
    });
    let response = exchange(&address2, "GET", "/", &[], b"", timeout).unwrap();
    assert_eq!((response.status, response.body.len()), (204, 0));
    assert_eq!(closer.join().unwrap(), ["close"]);
    assert_eq!(server.join().unwrap(), 2);
}
