"""What the loopback servers (Kafka broker, S3 server) and the tests' servers share."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port nobody listens on right now on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
