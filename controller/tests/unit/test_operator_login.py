"""kopf's connection is the process's own client configuration (``operator.connection_info``):
the same server, CA, client certificate and bearer token, so kopf runs as the identity the
binder writes with, however the kubeconfig given with ``--kubeconfig`` names it."""

from __future__ import annotations

import kopf
from kubernetes import client

from cozystack_gpu.operator import connection_info


def test_a_token_configuration_gives_kopf_the_same_server_token_and_ca() -> None:
    configuration = client.Configuration(host="https://api.example:6443")
    configuration.api_key = {"BearerToken": "sa-token"}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    configuration.ssl_ca_cert = "/run/ca.crt"
    info = connection_info(configuration, kopf.OperatorSettings())
    assert (info.server, info.scheme, info.token) == (
        "https://api.example:6443",
        "Bearer",
        "sa-token",
    )
    assert info.ca_path == "/run/ca.crt"
    assert info.certificate_path is None and not info.insecure


def test_a_certificate_configuration_gives_kopf_the_same_key_pair_and_no_token() -> None:
    configuration = client.Configuration(host="https://127.0.0.1:6443")
    configuration.cert_file, configuration.key_file = "/pki/admin.crt", "/pki/admin.key"
    configuration.verify_ssl = False
    info = connection_info(configuration, kopf.OperatorSettings())
    assert (info.certificate_path, info.private_key_path) == ("/pki/admin.crt", "/pki/admin.key")
    assert info.token is None and info.scheme is None and info.insecure
