"""The etcd client of the MetaStore, over plaintext or TLS.

``aetcd`` only ever opens insecure gRPC channels, so a TLS connection (a CA to check the
server against, and optionally a client certificate for etcd's ``--client-cert-auth``)
is a ``Client`` whose ``connect`` opens a secure channel; the rest (user/password
authentication, stubs, the watcher) is set up as aetcd sets it up. Everything else of
the client is aetcd's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aetcd
import grpc
from aetcd import rpc, watcher

from tierlog.errors import ConfigError


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """Files of a TLS connection to etcd: the CA that signed the server's certificate,
    and the client certificate and key (both or neither)."""

    cacert: str
    cert: str = ""
    key: str = ""

    def credentials(self) -> grpc.ChannelCredentials:
        if bool(self.cert) != bool(self.key):
            raise ConfigError("etcd TLS: cert and key go together (client certificate)")
        try:
            root = Path(self.cacert).read_bytes()
            chain = Path(self.cert).read_bytes() if self.cert else None
            key = Path(self.key).read_bytes() if self.key else None
        except OSError as exc:
            raise ConfigError(f"etcd TLS: cannot read {exc.filename}: {exc.strerror}") from None
        return grpc.ssl_channel_credentials(root, key, chain)


class TlsEtcdClient(aetcd.Client):
    """An aetcd client whose channel is a TLS one (see the module docstring)."""

    def __init__(self, tls: EtcdTls, **options: Any) -> None:
        super().__init__(**options)
        self._credentials = tls.credentials()

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        target = f"{self._host}:{self._port}"
        self.channel = grpc.aio.secure_channel(
            target, self._credentials, options=list(self._options.items())
        )
        if self._username is not None and self._password is not None:
            self.auth_stub = rpc.AuthStub(self.channel)
            answer = await self.auth_stub.Authenticate(
                rpc.AuthenticateRequest(name=self._username, password=self._password),
                timeout=self._timeout,
            )
            self.metadata = (("token", answer.token),)
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)
        self._watcher = watcher.Watcher(
            rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
        )
        self._connected.set()


def new_etcd_client(tls: EtcdTls | None, **options: Any) -> aetcd.Client:
    """A plaintext aetcd client, or a TLS one with ``tls``."""
    return aetcd.Client(**options) if tls is None else TlsEtcdClient(tls, **options)
