"""The MetaStore reaches etcd over TLS with a client certificate and a user/password
(the contract suite runs on such an etcd as its third backend, ``etcd-tls-auth``);
what it must refuse: plaintext to a TLS port, a wrong password, no client certificate,
a CA that did not sign etcd's certificate, malformed URI parameters."""

from __future__ import annotations

import uuid

import pytest

from tests.plugins.etcd import ETCD_ROOT_PASSWORD, etcd_tls_uri
from tests.server.certificates import make_certificates
from tierlog.errors import ConfigError
from tierlog.storage.errors import StorageError
from tierlog.storage.meta_store import open_meta_store

pytestmark = pytest.mark.etcd


def _namespace() -> str:
    return f"t-{uuid.uuid4().hex}"


def test_tls_and_password_work_end_to_end(etcd_tls_server):
    endpoint, tls = etcd_tls_server
    store = open_meta_store(etcd_tls_uri(endpoint, tls, _namespace()), timeout=2.0)
    try:
        created = store.create("k", b"v", epoch=3)
        assert store.get("k") == created
        lease = store.acquire_lease("l", "holder", ttl=5)
        assert lease.epoch >= 1
    finally:
        store.close()


def test_plaintext_to_the_tls_port_is_refused(etcd_tls_server):
    endpoint, _tls = etcd_tls_server
    with pytest.raises(StorageError):
        open_meta_store(f"etcd://root:{ETCD_ROOT_PASSWORD}@{endpoint}/{_namespace()}", timeout=1.0)


def test_a_wrong_password_is_refused(etcd_tls_server):
    endpoint, tls = etcd_tls_server
    uri = etcd_tls_uri(endpoint, tls, _namespace()).replace(ETCD_ROOT_PASSWORD, "wrong")
    with pytest.raises(StorageError):
        open_meta_store(uri, timeout=1.0)


def test_no_client_certificate_is_refused(etcd_tls_server):
    endpoint, tls = etcd_tls_server
    uri = f"etcd://root:{ETCD_ROOT_PASSWORD}@{endpoint}/{_namespace()}?cacert={tls.ca}"
    with pytest.raises(StorageError):
        open_meta_store(uri, timeout=1.0)


def test_a_foreign_ca_is_refused(etcd_tls_server, tmp_path):
    endpoint, tls = etcd_tls_server
    foreign = make_certificates(tmp_path / "foreign")
    uri = etcd_tls_uri(endpoint, tls, _namespace()).replace(str(tls.ca), str(foreign.ca))
    with pytest.raises(StorageError):
        open_meta_store(uri, timeout=1.0)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("cacert=/x&bogus=1", "unknown parameter 'bogus'"),
        ("cert=/a&key=/b", "needs cacert"),
        ("cacert=/x&cert=/a", "go together"),
        ("cacert=/x&cacert=/y", "given twice"),
    ],
)
def test_bad_etcd_uri_parameters_are_config_errors(query, message):
    with pytest.raises(ConfigError, match=message):
        open_meta_store(f"etcd://127.0.0.1:1/ns?{query}")


def test_unreadable_tls_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        open_meta_store(f"etcd://127.0.0.1:1/ns?cacert={tmp_path / 'missing.pem'}")
