"""The controller names itself, replica and part in the API server's audit log: the fault
suite tells a binder's claim watches from the test kit's by it."""

from __future__ import annotations

from pathlib import Path

import yaml

from cozystack_gpu import leader
from cozystack_gpu.__main__ import api_client, user_agent, version


def _kubeconfig(path: Path) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def test_each_client_names_the_program_its_version_the_replica_and_the_part(
    tmp_path: Path,
) -> None:
    config = _kubeconfig(tmp_path / "kubeconfig")
    binder = api_client(str(config), user_agent=user_agent("r1", "binder"))
    admission = api_client(str(config), user_agent=user_agent("r1", "admission"))
    assert binder.user_agent == f"cozystack-gpu-controller/{version()} (r1) binder"
    assert admission.user_agent.endswith("(r1) admission")


def test_the_lease_client_keeps_the_name_of_the_client_it_copies(tmp_path: Path) -> None:
    api = api_client(
        str(_kubeconfig(tmp_path / "kubeconfig")), user_agent=user_agent("r2", "binder")
    )
    clone = leader._without_retries(api)
    assert clone.configuration.retries == 0
    assert clone.user_agent == api.user_agent
