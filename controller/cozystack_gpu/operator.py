"""kopf's part of a replica: the admission webhooks, the liveness probe and the clean-up.

Imported by ``__main__`` once the process's cache and its binder run (importing kopf and
the webhooks costs about a second of CPU, which a new leader's first bind no longer waits
for); importing it registers the handlers. ``run`` hands kopf the replica's parts in its
memo and returns when kopf stops.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
from kubernetes import client

from cozystack_gpu.admission import handlers as admission  # registers the webhook handlers
from cozystack_gpu.cluster.informer import SharedInformers
from cozystack_gpu.config import Config
from cozystack_gpu.controller import Controller


@kopf.on.startup()
def _startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """The webhooks of this replica, on the process's cache (``memo.informers``, started
    with the binder before kopf was imported): every replica serves them, with its own
    client, so the binder's writes never hold up an admission answer."""
    settings.peering.standalone = True
    settings.posting.level = logging.WARNING
    controller: Controller = memo.controller
    admission.start(
        memo.admission_api,
        memo.config,
        settings,
        memo,
        memo.informers,
        feed_after=controller.first_pass_or_standby,
    )


@kopf.on.login()
def _login(memo: kopf.Memo, settings: kopf.OperatorSettings, **kwargs: Any) -> Any:
    """kopf's connection: the one the process's own clients use. In a pod kopf's own login
    through the kubernetes client finds the service account, as they do. Off the cluster,
    with ``--kubeconfig``, it would not: the client took the kubeconfig's path from the
    environment when it was imported, before the flag was read, and kopf found no
    credentials and stopped the process."""
    api: client.ApiClient | None = memo.get("admission_api")
    if memo.get("kubeconfig") is None or api is None:
        return kopf.login_via_client(memo=memo, settings=settings, **kwargs)
    return connection_info(api.configuration, settings)


def connection_info(
    configuration: client.Configuration, settings: kopf.OperatorSettings
) -> kopf.ConnectionInfo:
    """What kopf needs of a kubernetes client's configuration (its server, CA, client
    certificate and bearer token)."""
    # The bearer token as the client sends it ("Bearer <token>"); its refresh hook, when a
    # kubeconfig's exec plugin gave one, runs here, and again when kopf logs in anew.
    header = configuration.get_api_key_with_prefix("BearerToken") or ""
    words = header.split(" ", 1)  # RFC 7235: a scheme, a space, the credentials
    scheme, token = (words[0], words[1]) if len(words) == 2 else (None, words[0] or None)
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        trust_env=settings.networking.trust_env,
    )


@kopf.on.cleanup()
def _cleanup(memo: kopf.Memo, **_: Any) -> None:
    controller = memo.get("controller")
    if controller is not None:
        controller.stop()
    webhooks = memo.get("admission")
    if webhooks is not None:
        webhooks.stop()
    informers = memo.get("informers")
    if informers is not None:
        informers.stop()


@kopf.on.probe(id="binder")
def _binder_probe(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """The liveness answer: 200 with the replica's state, or 500 when a part of it is dead.

    kopf serves what probe handlers return as 200 whatever it says; only a handler that
    fails permanently makes its endpoint answer 500 (any other exception is retried and
    the probe hangs).
    """
    controller = memo.get("controller")
    if controller is None:
        return {"leader": False, "synced": False, "problems": []}
    health: dict[str, Any] = controller.health()
    if health["problems"]:
        raise kopf.PermanentError(
            "unhealthy: " + "; ".join(health["problems"]) + " (this replica no longer leads)"
        )
    return health


def not_ready(memo: kopf.Memo) -> str | None:
    """Why this replica must stay out of the webhook Service (its ``/readyz``)."""
    return admission.not_ready(memo.get("admission"))


def run(
    config: Config,
    kubeconfig: str | None,
    informers: SharedInformers,
    controller: Controller,
    admission_api: client.ApiClient,
    health_port: int,
    memo: kopf.Memo,
) -> None:
    """kopf's loop, until the process is told to stop."""
    memo.update(
        config=config,
        kubeconfig=kubeconfig,
        informers=informers,
        controller=controller,
        admission_api=admission_api,
    )
    kopf.run(
        clusterwide=True,
        standalone=True,
        # The replica's own name (the Lease's): kopf's default asks the passwd database for
        # the uid's user, which an image run under a uid it does not name has not. (kopf's
        # Identity is a NewType of str it does not export.)
        identity=config.identity,  # type: ignore[arg-type]
        liveness_endpoint=f"http://0.0.0.0:{health_port}/healthz" if health_port else None,
        memo=memo,
    )
