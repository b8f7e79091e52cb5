"""Controller configuration: flags, each with an environment variable and a default.

Every setting is documented in one table (``SETTINGS``) that feeds both ``--help`` and the
environment lookup, so the chart's values, the README and the code cannot disagree.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from cozystack_gpu.keys import (
    BINDER_WATCHES,
    DRA_WATCHES,
    ApiKind,
    RawNamesPolicy,
    parse_resource_names,
)
from cozystack_gpu.model.reservations import BookingSettings

DEFAULT_WEBHOOK_CERT_DIR = "/var/run/cozystack-gpu/webhook-certs"


@dataclass(frozen=True)
class Setting:
    flag: str
    env: str
    default: str
    help: str


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "--namespace",
        "GPU_NAMESPACE",
        "cozy-gpu",
        "namespace of the controller: its Lease and the gpu-settings ConfigMap",
    ),
    Setting(
        "--identity", "GPU_IDENTITY", "", "this replica's name in the Lease (default: hostname)"
    ),
    Setting(
        "--attachment-grace",
        "GPU_ATTACHMENT_GRACE",
        "120",
        "seconds an attachment may wait for its VMI to appear before it is cleared",
    ),
    Setting(
        "--rejection-ttl",
        "GPU_REJECTION_TTL",
        "600",
        "seconds a node that refused a pinned launcher pod is skipped for the set",
    ),
    Setting(
        "--raw-resource-names",
        "GPU_RAW_RESOURCE_NAMES",
        "allowed",
        "whether tenants may request GPU resource names without claims: allowed|forbidden",
    ),
    Setting(
        "--extra-resource-names",
        "GPU_EXTRA_RESOURCE_NAMES",
        "",
        "comma-joined GPU resource names to add to resourceNames (hoster list)",
    ),
    Setting(
        "--lease-duration",
        "GPU_LEASE_DURATION",
        "15",
        "seconds a leader's Lease is valid without renewal",
    ),
    Setting(
        "--renew-deadline",
        "GPU_RENEW_DEADLINE",
        "10",
        "seconds after its last renewal a leader stops binding",
    ),
    Setting(
        "--retry-period",
        "GPU_RETRY_PERIOD",
        "2",
        "seconds between Lease renewals and acquisition attempts",
    ),
    Setting(
        "--write-workers",
        "GPU_WRITE_WORKERS",
        "8",
        "status writes in flight at once (decisions stay serial)",
    ),
    Setting(
        "--metrics-port",
        "GPU_METRICS_PORT",
        "9090",
        "HTTPS port of /metrics, for a bearer token allowed get on /metrics (0: off)",
    ),
    Setting(
        "--inventory-stale-after",
        "GPU_INVENTORY_STALE_AFTER",
        "300",
        "seconds without a node agent report after which nothing new is placed on a node; "
        "its holds stay (0: never)",
    ),
    Setting(
        "--workload-records",
        "GPU_WORKLOAD_RECORDS",
        "true",
        "write cozystack.io Workload usage records: true|false",
    ),
    Setting(
        "--dra",
        "GPU_DRA",
        "auto",
        "read the DRA objects dra classes are served from (ResourceSlices, DeviceClasses, "
        "ResourceClaims): auto (when the API serves resource.k8s.io/v1)|true|false",
    ),
    Setting(
        "--reservation-max-lead",
        "GPU_RESERVATION_MAX_LEAD",
        "90d",
        "how far ahead a GPUReservation's window may start (reservations.maxLead): days, "
        "hours or minutes as 90d, 36h, 45m, or seconds",
    ),
    Setting(
        "--reservation-max-length",
        "GPU_RESERVATION_MAX_LENGTH",
        "30d",
        "how long a GPUReservation's window may last (reservations.maxLength), as "
        "--reservation-max-lead is written",
    ),
    Setting(
        "--reservation-warn-before",
        "GPU_RESERVATION_WARN_BEFORE",
        "30m",
        "how long before a GPUReservation's window ends its reservation and VMs are told "
        "(reservations.warnBefore), as --reservation-max-lead is written",
    ),
    Setting(
        "--webhook-port",
        "GPU_WEBHOOK_PORT",
        "9443",
        "HTTPS port of the admission webhooks, served by every replica (0: off)",
    ),
    Setting(
        "--webhook-cert-dir",
        "GPU_WEBHOOK_CERT_DIR",
        DEFAULT_WEBHOOK_CERT_DIR,
        "directory of the serving certificate of the webhooks and /metrics: tls.crt, tls.key "
        "and ca.crt (a cert-manager Secret's layout); they are read again when they change",
    ),
    Setting(
        "--webhook-client-ca",
        "GPU_WEBHOOK_CLIENT_CA",
        "",
        "PEM file of the CA that signed the client certificate kube-apiserver presents to "
        "webhooks; when set, a caller without such a certificate is refused at the TLS "
        "handshake (empty: any caller)",
    ),
)


@dataclass(frozen=True)
class Config:
    namespace: str
    identity: str
    attachment_grace: float
    rejection_ttl: float
    raw_resource_names: RawNamesPolicy
    extra_resource_names: frozenset[str]
    lease_duration: float
    renew_deadline: float
    retry_period: float
    write_workers: int
    metrics_port: int
    workload_records: bool
    # Settings added later carry their defaults here too, so callers that build a Config
    # by hand (tests, benchmarks) need not name them.
    inventory_stale_after: float = 300.0
    webhook_port: int = 9443
    webhook_cert_dir: str = DEFAULT_WEBHOOK_CERT_DIR
    # Only callers with a certificate of this CA reach the webhooks (empty: any caller).
    webhook_client_ca: str = ""
    # reservations.maxLead and reservations.maxLength, in seconds (SPEC §11).
    reservation_max_lead: int = 90 * 24 * 3600
    reservation_max_length: int = 30 * 24 * 3600
    # reservations.warnBefore: the Ending condition and Events come this long before the end.
    reservation_warn_before: int = 30 * 60
    # dra: auto, true or false; the process turns auto into true or false at its start
    # (``cluster.discovery.resolve_dra``), and anything left auto reads no DRA object.
    dra: str = "auto"

    @property
    def watches(self) -> tuple[ApiKind, ...]:
        """The kinds the model is read from: the DRA objects with them when dra is true."""
        return BINDER_WATCHES + (DRA_WATCHES if self.dra == "true" else ())

    @property
    def booking(self) -> BookingSettings:
        return BookingSettings(self.reservation_max_lead, self.reservation_max_length)


def _attr(setting: Setting) -> str:
    return setting.flag.lstrip("-").replace("-", "_")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for setting in SETTINGS:
        parser.add_argument(
            setting.flag,
            dest=_attr(setting),
            default=None,
            help=f"{setting.help} [env {setting.env}, default {setting.default or 'none'}]",
        )


def _bool(name: str, value: str) -> bool:
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"{name} must be true or false, got {value!r}")


def _choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    if value.lower() not in choices:
        raise ValueError(f"{name} must be one of {'|'.join(choices)}, got {value!r}")
    return value.lower()


DURATION_UNITS = {"d": 24 * 3600, "h": 3600, "m": 60, "s": 1}


def _duration(name: str, value: str) -> int:
    """Whole seconds from ``90d``, ``36h``, ``45m``, ``30s`` or a plain number of seconds."""
    text = value.strip()
    unit = DURATION_UNITS.get(text[-1:])
    digits = text[:-1] if unit is not None else text
    if not digits.isdigit() or int(digits) == 0:
        raise ValueError(
            f"{name} must be a positive whole number of days, hours, minutes or seconds "
            f"(90d, 36h, 45m, 30s), got {value!r}"
        )
    return int(digits) * (unit or 1)


def _port(name: str, value: float) -> int:
    if value != int(value) or value > 65535:
        raise ValueError(f"{name} must be a port number (0 to 65535), got {value:g}")
    return int(value)


def from_arguments(args: argparse.Namespace | None = None) -> Config:
    """Flags first, then the environment, then the defaults; refuses bad values by name."""
    raw: dict[str, str] = {}
    for setting in SETTINGS:
        value = getattr(args, _attr(setting), None) if args is not None else None
        if value is None:
            value = os.environ.get(setting.env, setting.default)
        raw[_attr(setting)] = value

    def number(name: str) -> float:
        try:
            result = float(raw[name])
        except ValueError:
            raise ValueError(
                f"{name.replace('_', '-')} must be a number, got {raw[name]!r}"
            ) from None
        if result < 0:
            raise ValueError(f"{name.replace('_', '-')} must not be negative, got {raw[name]!r}")
        return result

    try:
        policy = RawNamesPolicy(raw["raw_resource_names"])
    except ValueError:
        raise ValueError(
            f"raw-resource-names must be allowed or forbidden, got {raw['raw_resource_names']!r}"
        ) from None
    return Config(
        namespace=raw["namespace"],
        identity=raw["identity"] or socket.gethostname(),
        attachment_grace=number("attachment_grace"),
        rejection_ttl=number("rejection_ttl"),
        raw_resource_names=policy,
        extra_resource_names=parse_resource_names(raw["extra_resource_names"]),
        lease_duration=number("lease_duration"),
        renew_deadline=number("renew_deadline"),
        retry_period=number("retry_period"),
        write_workers=max(1, int(number("write_workers"))),
        metrics_port=int(number("metrics_port")),
        workload_records=_bool("workload-records", raw["workload_records"]),
        dra=_choice("dra", raw["dra"], ("auto", "true", "false")),
        inventory_stale_after=number("inventory_stale_after"),
        webhook_port=_port("webhook-port", number("webhook_port")),
        webhook_cert_dir=raw["webhook_cert_dir"],
        webhook_client_ca=raw["webhook_client_ca"],
        reservation_max_lead=_duration("reservation-max-lead", raw["reservation_max_lead"]),
        reservation_max_length=_duration("reservation-max-length", raw["reservation_max_length"]),
        reservation_warn_before=_duration(
            "reservation-warn-before", raw["reservation_warn_before"]
        ),
    )


def parse(argv: Sequence[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(prog="cozystack-gpu-controller")
    add_arguments(parser)
    return from_arguments(parser.parse_args(argv))
