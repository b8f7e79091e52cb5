# Copyright: Cozystack GPU authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

# The connection options of this collection's Kubernetes modules. They are kubernetes.core's
# (module_utils/gpu_k8s.py takes its AUTH_ARG_SPEC), documented here in our own words so
# that the modules' documentation needs no other collection: Galaxy's importer runs
# ansible-doc on this collection alone, and an extended fragment of kubernetes.core made it
# show the modules undocumented.

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  kubeconfig:
    description:
      - The kubeconfig to use, as a path to a file or as its content (a dictionary).
      - Without it, and without O(host), the file C($KUBECONFIG) names or C(~/.kube/config)
        is read, or the in-cluster ServiceAccount when the module runs in a pod.
      - Environment variable C(K8S_AUTH_KUBECONFIG).
    type: raw
  context:
    description:
      - The kubeconfig context to use (default, the kubeconfig's current context).
      - Environment variable C(K8S_AUTH_CONTEXT).
    type: str
  host:
    description:
      - The URL of the Kubernetes API server, to connect without a kubeconfig.
      - Environment variable C(K8S_AUTH_HOST).
    type: str
  api_key:
    description:
      - A bearer token to authenticate with.
      - Environment variable C(K8S_AUTH_API_KEY).
    type: str
  username:
    description:
      - A user name for basic authentication, where the API server still allows it.
      - Environment variable C(K8S_AUTH_USERNAME).
    type: str
  password:
    description:
      - The password that goes with O(username).
      - Environment variable C(K8S_AUTH_PASSWORD).
    type: str
  validate_certs:
    description:
      - Whether the API server's certificate is checked.
      - Environment variable C(K8S_AUTH_VERIFY_SSL).
    type: bool
    aliases: [verify_ssl]
  ca_cert:
    description:
      - The CA certificate that signs the API server's certificate.
      - Environment variable C(K8S_AUTH_SSL_CA_CERT).
    type: path
    aliases: [ssl_ca_cert]
  client_cert:
    description:
      - A client certificate to authenticate with.
      - Environment variable C(K8S_AUTH_CERT_FILE).
    type: path
    aliases: [cert_file]
  client_key:
    description:
      - The key of O(client_cert).
      - Environment variable C(K8S_AUTH_KEY_FILE).
    type: path
    aliases: [key_file]
  proxy:
    description:
      - An HTTP proxy to reach the API server through.
      - Environment variable C(K8S_AUTH_PROXY).
    type: str
  no_proxy:
    description:
      - Hosts reached without O(proxy), comma-separated.
      - Environment variable C(K8S_AUTH_NO_PROXY).
    type: str
  proxy_headers:
    description:
      - Headers sent to O(proxy).
    type: dict
    suboptions:
      proxy_basic_auth:
        description:
          - C(user:password) for the proxy's basic authentication.
          - Environment variable C(K8S_AUTH_PROXY_HEADERS_PROXY_BASIC_AUTH).
        type: str
      basic_auth:
        description:
          - C(user:password) for basic authentication through the proxy.
          - Environment variable C(K8S_AUTH_PROXY_HEADERS_BASIC_AUTH).
        type: str
      user_agent:
        description:
          - The User-Agent sent to the proxy.
          - Environment variable C(K8S_AUTH_PROXY_HEADERS_USER_AGENT).
        type: str
  persist_config:
    description:
      - Whether a token refreshed during the run is written back to the kubeconfig file.
      - Environment variable C(K8S_AUTH_PERSIST_CONFIG).
    type: bool
  impersonate_user:
    description:
      - The user to act as (the API server's impersonation); the credentials need the
        right to impersonate it.
      - Environment variable C(K8S_AUTH_IMPERSONATE_USER).
    type: str
  impersonate_groups:
    description:
      - The groups to act as, with O(impersonate_user).
      - Environment variable C(K8S_AUTH_IMPERSONATE_GROUPS).
    type: list
    elements: str
notes:
  - The connection options are those of C(kubernetes.core), read by its own client code.
"""
