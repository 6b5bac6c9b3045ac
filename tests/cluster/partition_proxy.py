"""A replication-listener proxy that knows which node dialed each connection through it,
so one node can be partitioned from its peers while they still reach each other.

Every node's replication listener sits behind one proxy (the address it advertises), so
a plain ``TcpProxy`` cut only breaks the links dialed *to* that node; the links it
dialed itself go through its peers' proxies, which also carry the peers' links with each
other. This proxy reads the dialer's first frame (``HELLO`` with its node name) before
connecting upstream: ``block(node)`` drops the connections that node dialed and refuses
its new ones. Isolating node X is then: X's own proxy ``cut()``, every other proxy
``block(X)``.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.cluster.nodes import HOST, Cluster, TcpProxy
from tierlog.formats import replication as wire


class PartitionProxy(TcpProxy):
    """A ``TcpProxy`` listening on a given port that can also block one dialer."""

    def __init__(self, target_host: str, target_port: int, port: int, names: tuple[str, ...]):
        self.target = (target_host, target_port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((HOST, port))
        self._listener.listen(64)
        self.port = port
        self._cut = False
        self._closed = False
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._hellos = {wire.encode(wire.Hello(name)): name for name in names}
        self._hello_bytes = max(len(h) for h in self._hellos)
        self._dialers: dict[socket.socket, str] = {}
        self.blocked: set[str] = set()
        threading.Thread(target=self._accept, daemon=True, name="partition-proxy").start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        first = b""
        client.settimeout(5)
        with contextlib.suppress(OSError):
            while len(first) < self._hello_bytes:
                data = client.recv(self._hello_bytes - len(first))
                if not data:
                    break
                first += data
        dialer = next((n for h, n in self._hellos.items() if first.startswith(h)), None)
        if self._cut or dialer is None or dialer in self.blocked:
            client.close()
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
            upstream.sendall(first)
        except OSError:
            client.close()
            return
        client.settimeout(None)
        upstream.settimeout(None)
        with self._lock:
            self._sockets.update((client, upstream))
            self._dialers[client] = self._dialers[upstream] = dialer
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data or self._cut or self._dialers.get(source) in self.blocked:
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            with self._lock:
                for s in (source, sink):
                    self._sockets.discard(s)
                    self._dialers.pop(s, None)

    def block(self, dialer: str) -> None:
        """Drop every connection ``dialer`` opened through this proxy; refuse new ones."""
        self.blocked.add(dialer)
        with self._lock:
            sockets = [s for s, d in self._dialers.items() if d == dialer]
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def heal(self) -> None:
        self.blocked.clear()
        self._cut = False


def use_partition_proxies(cluster: Cluster) -> None:
    """Replace every node's replication proxy (before ``start``) by a ``PartitionProxy``
    on the same port, the one the node advertises."""
    names = tuple(cluster.nodes)
    for node in cluster.nodes.values():
        old = node.replication_proxy
        assert old is not None, "the cluster needs proxied_replication=True"
        with contextlib.suppress(OSError):  # wakes its accept thread, freeing the port
            old._listener.shutdown(socket.SHUT_RDWR)
        old.close()
        node.replication_proxy = PartitionProxy(*old.target, port=old.port, names=names)


def isolate(cluster: Cluster, name: str) -> None:
    """Cut ``name``'s replication links both ways; its peers still reach each other."""
    for node in cluster.nodes.values():
        proxy = node.replication_proxy
        assert isinstance(proxy, PartitionProxy)
        if node.name == name:
            proxy.cut()
        else:
            proxy.block(name)
