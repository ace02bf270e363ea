"""One HTTP/2 request over cleartext with prior knowledge (h2c), ended the way the caller
asks, for the integration tests: the Rust test kit speaks HTTP/1.1 only.

    client.py HOST:PORT METHOD PATH ENDING [BODY] [HEADER:VALUE ...]

ENDING is how the request stream ends:
  headers         HEADERS with END_STREAM (no body)
  data            HEADERS, DATA with END_STREAM
  trailers        HEADERS, DATA, trailing HEADERS with END_STREAM
  trailers-only   HEADERS, trailing HEADERS with END_STREAM (no DATA)

Prints one JSON line: {"status": int or null, "headers": {...}, "body": str, "reset": bool}.
"""

import json
import socket
import sys

import h2.config
import h2.connection
import h2.events


def main():
    address, method, path, ending = sys.argv[1:5]
    body = sys.argv[5].encode() if len(sys.argv) > 5 else b""
    extra = [tuple(h.split(":", 1)) for h in sys.argv[6:]]
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    conn = h2.connection.H2Connection(
        config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    )
    conn.initiate_connection()
    stream = conn.get_next_available_stream_id()
    headers = [(":method", method), (":path", path), (":scheme", "http"),
               (":authority", address)] + extra
    conn.send_headers(stream, headers, end_stream=(ending == "headers"))
    if ending in ("data", "trailers"):
        conn.send_data(stream, body, end_stream=(ending == "data"))
    if ending in ("trailers", "trailers-only"):
        conn.send_headers(stream, [("x-trailer", "end")] + extra, end_stream=True)
    sock.sendall(conn.data_to_send())

    result = {"status": None, "headers": {}, "body": "", "reset": False}
    received = b""
    done = False
    while not done:
        chunk = sock.recv(65536)
        if not chunk:
            break
        for event in conn.receive_data(chunk):
            if isinstance(event, h2.events.ResponseReceived):
                result["headers"] = dict(event.headers)
                result["status"] = int(result["headers"].get(":status", 0))
            elif isinstance(event, h2.events.DataReceived):
                received += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                result["reset"] = True
                done = True
            elif isinstance(event, (h2.events.StreamEnded, h2.events.ConnectionTerminated)):
                done = True
        sock.sendall(conn.data_to_send())
    sock.close()
    result["body"] = received.decode("utf-8", "replace")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
