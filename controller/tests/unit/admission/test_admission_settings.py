"""The webhook server's settings: flag, environment variable, default, refusal by name."""

from __future__ import annotations

import argparse

import pytest

from cozystack_gpu import config


def test_the_webhook_serves_on_9443_from_the_cert_manager_layout_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GPU_WEBHOOK_PORT", raising=False)
    monkeypatch.delenv("GPU_WEBHOOK_CERT_DIR", raising=False)
    settings = config.parse([])
    assert settings.webhook_port == 9443
    assert settings.webhook_cert_dir == "/var/run/cozystack-gpu/webhook-certs"


def test_flags_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_WEBHOOK_PORT", "8443")
    monkeypatch.setenv("GPU_WEBHOOK_CERT_DIR", "/env/certs")
    assert config.parse([]).webhook_port == 8443
    settings = config.parse(["--webhook-port", "0", "--webhook-cert-dir", "/flag/certs"])
    assert (settings.webhook_port, settings.webhook_cert_dir) == (0, "/flag/certs")


@pytest.mark.parametrize("port", ["70000", "1.5"])
def test_a_port_that_is_no_port_is_refused_by_name(port: str) -> None:
    with pytest.raises(ValueError, match="webhook-port must be a port number"):
        config.from_arguments(config_args("--webhook-port", port))


def config_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    return parser.parse_args(list(argv))
