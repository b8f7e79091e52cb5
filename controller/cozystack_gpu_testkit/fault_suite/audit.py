"""What the API server's audit log says of the claims: each claim status write
(``claim_writes``, ``most_at_once``), and each binder's claim lists and watches
(``claim_feeds``)."""

from __future__ import annotations

import datetime
import json
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ClaimWrite:
    """One claim status write as the API server's audit log has it."""

    source: str
    claim: str  # namespace/name
    code: int
    received: float  # epoch seconds
    done: float


def claim_writes(audit_log: Path) -> list[ClaimWrite]:
    writes = []
    for line in audit_log.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line being written
        ref = event.get("objectRef") or {}
        if event.get("stage") != "ResponseComplete" or ref.get("subresource") != "status":
            continue  # the claim lists and watches are audited too
        writes.append(
            ClaimWrite(
                source=(event.get("sourceIPs") or [""])[0],
                claim=f"{ref.get('namespace')}/{ref.get('name')}",
                code=int((event.get("responseStatus") or {}).get("code") or 0),
                received=_epoch(event["requestReceivedTimestamp"]),
                done=_epoch(event["stageTimestamp"]),
            )
        )
    return writes


def claim_feeds(audit_log: Path) -> list[str]:
    """Each binder's claim lists and watches, in order: when it listed, from which
    resourceVersion each watch ran and how it ended. Told with an order never judged, it
    says whether the binder could have seen the order."""
    feeds = []
    for line in audit_log.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        agent = str(event.get("userAgent") or "")
        if event.get("verb") not in ("list", "watch") or "binder" not in agent:
            continue
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(event.get("requestURI", "")).query)
        feeds.append(
            f"{event['requestReceivedTimestamp']} {agent.split(' ', 1)[-1]} {event['verb']} "
            f"{event.get('stage')} from resourceVersion "
            f"{query.get('resourceVersion', ['(latest)'])[0]} until {event['stageTimestamp']} "
            f"answered {(event.get('responseStatus') or {}).get('code')}"
        )
    return feeds


def _epoch(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def most_at_once(writes: Sequence[ClaimWrite]) -> int:
    """The most writes the API server was handling at the same moment."""
    edges = sorted([(w.received, 1) for w in writes] + [(w.done, -1) for w in writes])
    peak = current = 0
    for _stamp, step in edges:
        current += step
        peak = max(peak, current)
    return peak
