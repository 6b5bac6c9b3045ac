"""TLS contexts for the stream listener and the admin API, from the ``[tls]`` section.

The stream protocol over TLS has its own port (RabbitMQ's convention: 5551 beside
the plain 5552); the admin API is served over HTTPS with the same certificate.
With ``verify_client`` set, client certificates must chain to ``cafile``; the
certificate's CN then names the user for SASL EXTERNAL.
"""

from __future__ import annotations

import ssl

from tierlog.errors import ConfigError
from tierlog.server.config import ClusterSection, TlsSection

_VERIFY = {
    "none": ssl.CERT_NONE,
    "optional": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


def server_context(tls: TlsSection, *, client_certificates: bool = True) -> ssl.SSLContext | None:
    """The server-side SSLContext (TLS 1.2+), or None when TLS is not configured.

    ``client_certificates=False`` (the admin API, which authenticates with HTTP basic
    or bearer tokens) never asks for a client certificate.
    """
    if not tls.enabled:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(tls.certfile, tls.keyfile)
        if tls.cafile:
            context.load_verify_locations(cafile=tls.cafile)
    except (OSError, ssl.SSLError) as exc:
        # the message names the file and the reason; never key material
        raise ConfigError(f"cannot load TLS certificate/key/CA: {exc}") from None
    context.verify_mode = _VERIFY[tls.verify_client] if client_certificates else ssl.CERT_NONE
    return context


def replication_contexts(
    cluster: ClusterSection,
) -> tuple[ssl.SSLContext, ssl.SSLContext] | tuple[None, None]:
    """The (accepting, dialing) SSLContexts of the replication links: mutual TLS, each
    side presenting its node certificate and requiring the peer's to chain to the
    cluster CA (``cluster.tls_cafile``). Host names are not checked: nodes dial the
    address another node announced, which may be any of its addresses; the peer is
    identified by a certificate of the cluster's own CA and then by the cluster secret's
    proof. (None, None) without ``cluster.tls_certfile``."""
    if not cluster.tls:
        return None, None
    accepting = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    dialing = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    for context in (accepting, dialing):
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(cluster.tls_certfile, cluster.tls_keyfile)
            context.load_verify_locations(cafile=cluster.tls_cafile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load cluster TLS certificate/key/CA: {exc}") from None
    accepting.verify_mode = ssl.CERT_REQUIRED
    dialing.check_hostname = False
    dialing.verify_mode = ssl.CERT_REQUIRED
    return accepting, dialing
