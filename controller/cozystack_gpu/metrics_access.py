"""Who may read /metrics: the rule, apart from the server that asks the API server.

The metrics carry the inventory (capacity and held units per node and class) that GPUClass
status keeps from tenants, so they go only to a client the API server vouches for
(TokenReview) and allows ``get`` on the non-resource URL (SubjectAccessReview), as
controller-runtime's ``WithAuthenticationAndAuthorization`` filter does. A hoster grants it
by binding the chart's ClusterRole ``cozystack-gpu-metrics-reader`` (RBAC cannot grant a
non-resource URL in a namespace: no RoleBinding a tenant can make reaches it).

Answers are kept a short while by the token's hash, so a scrape every 15 s costs no API
call; a refusal is kept shorter, so a grant takes effect soon.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

METRICS_PATH = "/metrics"
READER_ROLE = "cozystack-gpu-metrics-reader"
ALLOWED_TTL_S = 60.0
DENIED_TTL_S = 10.0
# Enough for every scraper of a cluster; a client sending random tokens only pushes its own
# entries out.
MAX_ENTRIES = 1024

_HOW_TO = (
    f"scrape with the bearer token of an identity bound to ClusterRole {READER_ROLE} "
    "(docs/operations.md, Metrics)"
)


@dataclass(frozen=True)
class Decision:
    """The answer to one request: an HTTP status and, when refused, why and what fixes it."""

    status: int
    reason: str = ""

    @property
    def allowed(self) -> bool:
        return self.status == 200


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None without one."""
    if not authorization:
        return None
    scheme, _space, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def token_key(token: str) -> str:
    """What the cache keeps instead of the token itself."""
    return hashlib.sha256(token.encode()).hexdigest()


def no_token() -> Decision:
    return Decision(401, f"no bearer token: {_HOW_TO}")


def review_failed(error: str) -> Decision:
    """The API server could not be asked: refused, not kept (the next scrape asks again)."""
    return Decision(503, f"the token could not be reviewed ({error}); retry")


def subject_access_review(user: Mapping[str, Any], path: str, verb: str) -> dict[str, Any]:
    """The SubjectAccessReview for a TokenReview's user on the non-resource URL."""
    spec: dict[str, Any] = {
        "user": user.get("username", ""),
        "groups": list(user.get("groups") or []),
        "nonResourceAttributes": {"path": path, "verb": verb},
    }
    if user.get("uid"):
        spec["uid"] = user["uid"]
    if user.get("extra"):
        spec["extra"] = {k: list(v) for k, v in user["extra"].items()}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


def authenticated(token_review_status: Mapping[str, Any]) -> Decision | None:
    """None when the TokenReview vouches for the token; else the 401."""
    if token_review_status.get("authenticated") and (token_review_status.get("user") or {}).get(
        "username"
    ):
        return None
    error = token_review_status.get("error") or "the API server does not know it"
    return Decision(401, f"the bearer token is not valid ({error}): {_HOW_TO}")


def authorized(
    user: Mapping[str, Any], access_review_status: Mapping[str, Any], path: str, verb: str
) -> Decision:
    """200 when the SubjectAccessReview allows; else the 403, naming who was refused."""
    if access_review_status.get("allowed") and not access_review_status.get("denied"):
        return Decision(200)
    why = access_review_status.get("reason") or "no RBAC rule allows it"
    return Decision(
        403,
        f"{user.get('username')} may not {verb} {path} ({why}): {_HOW_TO}",
    )


class DecisionCache:
    """Decisions by token hash, each kept for its TTL; the oldest go first when full.
    Only 200, 401 and 403 are kept: a failed review is asked again."""

    def __init__(
        self,
        allowed_ttl: float = ALLOWED_TTL_S,
        denied_ttl: float = DENIED_TTL_S,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        self.allowed_ttl, self.denied_ttl, self.max_entries = allowed_ttl, denied_ttl, max_entries
        self._entries: OrderedDict[str, tuple[float, Decision]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, now: float) -> Decision | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            expires, decision = entry
            if now >= expires:
                del self._entries[key]
                return None
            return decision

    def put(self, key: str, decision: Decision, now: float) -> None:
        if decision.status not in (200, 401, 403):
            return
        ttl = self.allowed_ttl if decision.allowed else self.denied_ttl
        with self._lock:
            self._entries.pop(key, None)
            self._entries[key] = (now + ttl, decision)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class MetricsAccess:
    """The decision for one request's ``Authorization`` header: cached, else ``review``
    (the TokenReview and SubjectAccessReview, the caller's I/O) asked once."""

    def __init__(
        self,
        review: Callable[[str], Decision],
        clock: Callable[[], float],
        cache: DecisionCache | None = None,
    ) -> None:
        self.review, self.clock = review, clock
        self.cache = cache if cache is not None else DecisionCache()

    def check(self, authorization: str | None) -> Decision:
        token = bearer_token(authorization)
        if token is None:
            return no_token()
        key = token_key(token)
        kept = self.cache.get(key, self.clock())
        if kept is not None:
            return kept
        decision = self.review(token)
        self.cache.put(key, decision, self.clock())
        return decision
