"""A real TCP proxy in front of the live service that plays scripted faults, one per request.

Faults: "drop" forwards the request, lets the service answer, and closes the client's connection
without passing the answer on (the service did the work, the client never hears of it);
"503" answers 503 itself without forwarding; "pass" (and an empty script) forwards both ways.
Each connection carries one request (`Connection: close`), so a request is a connection.
"""

import socket
import socketserver
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 0\r\nContent-Length: 31\r\nConnection: close\r\n\r\n"
    b'{"detail": "injected by proxy"}'
)


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    lines = head.split(b"\r\n")
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        body += conn.recv(65536)
    kept = [line for line in lines if not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*kept, b"Connection: close"]) + b"\r\n\r\n" + body


@dataclass
class FaultProxy:
    upstream: tuple[str, int]
    faults: deque[str] = field(default_factory=deque)
    seen: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, fault)
    url: str = ""

    def handle(self, conn: socket.socket) -> None:
        request = _read_request(conn)
        if not request:
            return
        method, path = request.split(b" ", 2)[:2]
        fault = self.faults.popleft() if self.faults else "pass"
        self.seen.append((method.decode(), path.decode(), fault))
        if fault == "503":
            conn.sendall(UNAVAILABLE)
            return
        with socket.create_connection(self.upstream) as upstream:
            upstream.sendall(request)
            response = b""
            while chunk := upstream.recv(65536):
                response += chunk
        if fault == "drop":
            return  # the connection closes with nothing sent back
        conn.sendall(response)

    def requests_to(self, method: str, path: str) -> list[str]:
        """The faults played on the requests to `method path`, in order."""
        return [fault for m, p, fault in self.seen if (m, p.split("?")[0]) == (method, path)]


@contextmanager
def fault_proxy(base_url: str) -> Iterator[FaultProxy]:
    parts = urlsplit(base_url)
    proxy = FaultProxy(upstream=(parts.hostname or "127.0.0.1", parts.port or 80))

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            proxy.handle(self.request)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    proxy.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
