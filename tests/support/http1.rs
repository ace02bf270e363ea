//! HTTP/1.1 framing, written once: requests and responses, `content-length` and chunked
//! bodies, keep-alive. The simulated model server, the integration tests, the soak and the
//! benchmark all speak HTTP through this file.
//!
//! Standard library only, and nothing from the picker's crate: the simulator includes this file
//! with `#[path = "../../tests/support/http1.rs"] mod http1;`.
//!
//! - Reading: [`read_request`] (server side), [`read_response`] / [`read_response_head`] +
//!   [`read_body`] (client side, with a callback per body piece for timing streams).
//! - Writing: [`write_request`], [`write_response`], and for streams [`write_chunked_head`],
//!   [`write_chunk`], [`write_last_chunk`].
//! - Connections: [`exchange`] (one request on a fresh connection), [`Client`] (keep-alive),
//!   [`serve`] (a server's keep-alive loop over one accepted connection).
#![allow(dead_code)]

use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Header names are kept lower-case; values trimmed.
pub type Headers = Vec<(String, String)>;

/// The first header called `name` (case-insensitive).
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// A request as a server reads it, body de-chunked.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub method: String,
    /// The request target as sent, query included.
    pub target: String,
    pub headers: Headers,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    /// The target without its query string.
    pub fn path(&self) -> &str {
        self.target.split(['?', '#']).next().unwrap_or("")
    }

    /// The client asked to close the connection after this exchange.
    pub fn wants_close(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// A response as a client reads it, body de-chunked.
#[derive(Debug, Clone, Default)]
pub struct Response {
    pub status: u16,
    pub headers: Headers,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The server will close the connection after this response.
    pub fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// How a message's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    Length(usize),
    Chunked,
    /// A response with neither: the body runs until the server closes.
    UntilClose,
}

impl Framing {
    /// From a message's headers; `UntilClose` only makes sense for responses (a request with
    /// neither header has no body: callers pass `Length(0)` then).
    pub fn of(headers: &[(String, String)]) -> Framing {
        if header(headers, "transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            Framing::Chunked
        } else if let Some(length) = header(headers, "content-length") {
            Framing::Length(length.trim().parse().unwrap_or(0))
        } else {
            Framing::UntilClose
        }
    }
}

fn invalid(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("bad HTTP/1.1: {what}"))
}

/// The start line and headers; `None` at a clean end of stream before the start line.
pub fn read_head<R: BufRead>(reader: &mut R) -> io::Result<Option<(String, Headers)>> {
    let mut start = String::new();
    if reader.read_line(&mut start)? == 0 {
        return Ok(None);
    }
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').ok_or_else(|| invalid(line))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    Ok(Some((start.trim_end().to_string(), headers)))
}

/// Reads a body of the given framing, handing each piece to `on_data` as it arrives (for a
/// chunked body: each chunk) and returning the whole.
pub fn read_body<R: BufRead>(
    reader: &mut R,
    framing: Framing,
    on_data: &mut dyn FnMut(&[u8]),
) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    match framing {
        Framing::Length(length) => {
            body = vec![0; length];
            reader.read_exact(&mut body)?;
            on_data(&body);
        }
        Framing::UntilClose => {
            reader.read_to_end(&mut body)?;
            on_data(&body);
        }
        Framing::Chunked => loop {
            let mut size_line = String::new();
            if reader.read_line(&mut size_line)? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let size_text = size_line.trim().split(';').next().unwrap_or("");
            let size = usize::from_str_radix(size_text, 16)
                .map_err(|_| invalid(format!("chunk size {size_line:?}")))?;
            if size == 0 {
                // Trailers, if any, end with an empty line.
                loop {
                    let mut trailer = String::new();
                    if reader.read_line(&mut trailer)? == 0 || trailer.trim_end().is_empty() {
                        return Ok(body);
                    }
                }
            }
            let start = body.len();
            body.resize(start + size, 0);
            reader.read_exact(&mut body[start..])?;
            on_data(&body[start..]);
            let mut crlf = [0; 2];
            reader.read_exact(&mut crlf)?;
        },
    }
    Ok(body)
}

/// One request; `None` at a clean end of stream (the client closed a kept-alive connection).
pub fn read_request<R: BufRead>(reader: &mut R) -> io::Result<Option<Request>> {
    let Some((start, headers)) = read_head(reader)? else {
        return Ok(None);
    };
    let mut parts = start.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err(invalid(&start));
    };
    let framing = match Framing::of(&headers) {
        Framing::UntilClose => Framing::Length(0),
        framing => framing,
    };
    let body = read_body(reader, framing, &mut |_| {})?;
    Ok(Some(Request {
        method: method.to_string(),
        target: target.to_string(),
        headers,
        body,
    }))
}

/// A response's status and headers.
pub fn read_response_head<R: BufRead>(reader: &mut R) -> io::Result<(u16, Headers)> {
    let (start, headers) = read_head(reader)?.ok_or(io::ErrorKind::UnexpectedEof)?;
    let status = start
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid(&start))?;
    Ok((status, headers))
}

/// One response, read by its framing (not by waiting for the server to close).
pub fn read_response<R: BufRead>(reader: &mut R) -> io::Result<Response> {
    let (status, headers) = read_response_head(reader)?;
    let body = read_body(reader, Framing::of(&headers), &mut |_| {})?;
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// Writes a request with a `content-length` body. `headers` should include `host`.
pub fn write_request<W: Write>(
    out: &mut W,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> io::Result<()> {
    let mut head = format!("{method} {target} HTTP/1.1\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    out.write_all(head.as_bytes())?;
    out.write_all(body)?;
    out.flush()
}

/// The reason phrase for the statuses this project sends.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

fn status_line_and_headers(status: u16, headers: &[(&str, &str)]) -> String {
    let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head
}

/// Writes a whole response with a `content-length` body, head and body in one write: a
/// server killed between two writes would leave the client a head without its body.
pub fn write_response<W: Write>(
    out: &mut W,
    status: u16,
    headers: &[(&str, &str)],
    body: &[u8],
) -> io::Result<()> {
    let mut head = status_line_and_headers(status, headers);
    head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    let mut message = head.into_bytes();
    message.extend_from_slice(body);
    out.write_all(&message)?;
    out.flush()
}

/// Starts a chunked response; follow with [`write_chunk`]s and one [`write_last_chunk`].
pub fn write_chunked_head<W: Write>(
    out: &mut W,
    status: u16,
    headers: &[(&str, &str)],
) -> io::Result<()> {
    let mut head = status_line_and_headers(status, headers);
    head.push_str("transfer-encoding: chunked\r\n\r\n");
    out.write_all(head.as_bytes())?;
    out.flush()
}

/// One chunk, flushed (an empty `data` would end the body, so it writes nothing).
pub fn write_chunk<W: Write>(out: &mut W, data: &[u8]) -> io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    out.write_all(format!("{:x}\r\n", data.len()).as_bytes())?;
    out.write_all(data)?;
    out.write_all(b"\r\n")?;
    out.flush()
}

pub fn write_last_chunk<W: Write>(out: &mut W) -> io::Result<()> {
    out.write_all(b"0\r\n\r\n")?;
    out.flush()
}

/// One exchange on a fresh connection (`connection: close`); `headers` come after `host`.
pub fn exchange(
    address: &str,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> io::Result<Response> {
    let mut client = Client::connect(address, timeout)?;
    let mut all = vec![("host", address), ("connection", "close")];
    all.extend_from_slice(headers);
    client.send(method, target, &all, body, &mut |_| {})
}

/// A client connection kept alive across exchanges.
pub struct Client {
    reader: BufReader<TcpStream>,
    closed: bool,
}

impl Client {
    /// Connects with `TCP_NODELAY` (head and body go out in separate writes; without it
    /// Nagle's algorithm and delayed ACKs add ~40 ms) and a read timeout.
    pub fn connect(address: &str, read_timeout: Duration) -> io::Result<Client> {
        let stream = TcpStream::connect(address)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(read_timeout))?;
        Ok(Client {
            reader: BufReader::new(stream),
            closed: false,
        })
    }

    /// Sends one request and reads its response; `on_data` sees each body piece as it
    /// arrives. `headers` are sent as given (add `host`).
    pub fn send(
        &mut self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        on_data: &mut dyn FnMut(&[u8]),
    ) -> io::Result<Response> {
        write_request(self.reader.get_mut(), method, target, headers, body)?;
        let (status, headers) = read_response_head(&mut self.reader)?;
        let body = read_body(&mut self.reader, Framing::of(&headers), on_data)?;
        let response = Response {
            status,
            headers,
            body,
        };
        self.closed |= response.closes() || Framing::of(&response.headers) == Framing::UntilClose;
        Ok(response)
    }

    /// The server closed (or will close) this connection: open a new one for the next request.
    pub fn is_closed(&self) -> bool {
        self.closed
    }
}

/// A server's loop over one accepted connection: reads requests and hands each to `handle`
/// with the stream to answer on, until the client closes, asks to close, sends something
/// unreadable, or `handle` returns false. Borrows the stream, so a caller that keeps it (to
/// shut it down) costs no third descriptor: a pod process serving thousands of kept-alive
/// connections runs into the open-files limit otherwise.
pub fn serve(stream: &TcpStream, mut handle: impl FnMut(&Request, &mut TcpStream) -> bool) {
    let _ = stream.set_nodelay(true);
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    while let Ok(Some(request)) = read_request(&mut reader) {
        if !handle(&request, &mut out) || request.wants_close() {
            return;
        }
    }
}
