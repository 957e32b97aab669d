"""The rendezvous: a small TCP key-value store at MASTER_ADDR:MASTER_PORT, as PyTorch's
TCPStore, used only to exchange what the engines need to find each other (MPI's port name,
NCCL's unique id) and, between launchers, that a rank failed. No array data goes through it:
the collectives run on MPI or NCCL.

Protocol: one JSON object per line each way. ``{"op": "set", "key": k, "value": v}`` ->
``{"ok": true}``; ``{"op": "get", "key": k, "timeout": s}`` -> ``{"value": v}`` once the key
is set, or ``{"value": null}`` after ``s`` seconds.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any, Optional


class StoreServer:
    """The store, served from a daemon thread of this process (node 0's launcher, or rank 0
    when no launcher started the ranks)."""

    def __init__(self, host: str, port: int) -> None:
        self._data: dict = {}
        self._cond = threading.Condition()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("" if host in ("", "0.0.0.0") else _bind_address(host), port))
        self._sock.listen(128)
        self.port = self._sock.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._serve, name="fastmetal-store", daemon=True).start()

    def set(self, key: str, value: str) -> None:
        with self._cond:
            self._data[key] = value
            self._cond.notify_all()

    def get(self, key: str, timeout: float) -> Optional[str]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while key not in self._data:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return None
                self._cond.wait(min(left, 0.5))
            return self._data[key]

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.close()
        except OSError:
            pass
        with self._cond:
            self._cond.notify_all()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as f:
            for line in f:
                try:
                    req = json.loads(line)
                    if req["op"] == "set":
                        self.set(str(req["key"]), str(req["value"]))
                        reply: dict = {"ok": True}
                    elif req["op"] == "get":
                        reply = {"value": self.get(str(req["key"]), float(req["timeout"]))}
                    else:
                        reply = {"error": f"unknown op {req['op']!r}"}
                except (ValueError, KeyError, TypeError) as e:
                    reply = {"error": str(e)}
                try:
                    f.write(json.dumps(reply).encode() + b"\n")
                    f.flush()
                except OSError:
                    return


def _bind_address(host: str) -> str:
    """Where to listen for MASTER_ADDR: every interface, unless it names this loopback."""
    return host if host.startswith("127.") or host == "localhost" else ""


class StoreClient:
    """A connection to the store; connecting retries until ``timeout`` (the server may start
    after the client)."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            try:
                self._sock = socket.create_connection((host, port), timeout=5)
                break
            except OSError as e:
                last = e
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"[fastmetal.distributed] expected the rendezvous at MASTER_ADDR:"
                        f"MASTER_PORT = {host}:{port} to answer within {timeout:.0f} s, got "
                        f"{type(last).__name__}: {last} (is rank 0 / node 0's launcher "
                        "running, and the port reachable?)") from None
                time.sleep(0.1)
        self._sock.settimeout(None)
        self._file = self._sock.makefile("rwb")
        self._lock = threading.Lock()

    def _call(self, req: dict) -> dict:
        with self._lock:
            self._file.write(json.dumps(req).encode() + b"\n")
            self._file.flush()
            line = self._file.readline()
        if not line:
            raise ConnectionError("[fastmetal.distributed] the rendezvous store closed the "
                                  "connection (its process ended)")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"[fastmetal.distributed] rendezvous store: {reply['error']}")
        return reply

    def set(self, key: str, value: str) -> None:
        self._call({"op": "set", "key": key, "value": value})

    def get(self, key: str, timeout: float) -> Optional[str]:
        """The key's value, waiting up to ``timeout`` seconds; None if it was not set."""
        return self._call({"op": "get", "key": key, "timeout": timeout})["value"]

    def close(self) -> None:
        try:  # shutdown first: a thread blocked reading this connection wakes up
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
