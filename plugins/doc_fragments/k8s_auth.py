# -*- coding: utf-8 -*-
# Copyright: cozystack.gpu contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Connection options of the modules that talk to the Kubernetes API."""

from __future__ import annotations


class ModuleDocFragment:
    """Shared with kubernetes.core's names and K8S_AUTH_* environment fallbacks."""

    DOCUMENTATION = r"""
options:
  kubeconfig:
    description:
      - Path to a kubeconfig file. Defaults to C(~/.kube/config), then the in-cluster
        service account. Env C(K8S_AUTH_KUBECONFIG).
    type: path
  context:
    description: Kubeconfig context to use. Env C(K8S_AUTH_CONTEXT).
    type: str
  host:
    description: URL of the API server. Env C(K8S_AUTH_HOST).
    type: str
  api_key:
    description: Bearer token. Env C(K8S_AUTH_API_KEY).
    type: str
  validate_certs:
    description: Verify the API server's certificate. Env C(K8S_AUTH_VERIFY_SSL).
    type: bool
    aliases: [verify_ssl]
  ca_cert:
    description: CA certificate of the API server. Env C(K8S_AUTH_SSL_CA_CERT).
    type: path
    aliases: [ssl_ca_cert]
  client_cert:
    description: Client certificate. Env C(K8S_AUTH_CERT_FILE).
    type: path
    aliases: [cert_file]
  client_key:
    description: Key of the client certificate. Env C(K8S_AUTH_KEY_FILE).
    type: path
    aliases: [key_file]
"""
