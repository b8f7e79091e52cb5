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


def test_booking_limits_default_to_90_and_30_days_and_read_days_hours_minutes_or_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GPU_RESERVATION_MAX_LEAD", raising=False)
    monkeypatch.delenv("GPU_RESERVATION_MAX_LENGTH", raising=False)
    booking = config.parse([]).booking
    assert (booking.max_lead, booking.max_length) == (90 * 86400, 30 * 86400)
    monkeypatch.setenv("GPU_RESERVATION_MAX_LEAD", "36h")
    settings = config.parse(["--reservation-max-length", "45m"])
    assert (settings.booking.max_lead, settings.booking.max_length) == (36 * 3600, 45 * 60)
    assert config.parse(["--reservation-max-lead", "600"]).booking.max_lead == 600


def test_the_end_warning_defaults_to_30_minutes_and_reads_a_duration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GPU_RESERVATION_WARN_BEFORE", raising=False)
    assert config.parse([]).reservation_warn_before == 30 * 60
    monkeypatch.setenv("GPU_RESERVATION_WARN_BEFORE", "2m")
    assert config.parse([]).reservation_warn_before == 120
    with pytest.raises(ValueError, match="reservation-warn-before must be a positive whole"):
        config.parse(["--reservation-warn-before=0m"])


@pytest.mark.parametrize("value", ["0d", "-1h", "1.5d", "90 days", ""])
def test_a_booking_limit_that_is_no_positive_duration_is_refused_by_name(value: str) -> None:
    with pytest.raises(ValueError, match="reservation-max-lead must be a positive whole number"):
        config.parse([f"--reservation-max-lead={value}"])
