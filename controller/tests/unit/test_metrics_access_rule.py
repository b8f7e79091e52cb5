"""Who may read /metrics (cozystack_gpu/metrics_access.py): the rule and its cache."""

from __future__ import annotations

import pytest

from cozystack_gpu.metrics_access import (
    READER_ROLE,
    Decision,
    DecisionCache,
    MetricsAccess,
    authenticated,
    authorized,
    bearer_token,
    review_failed,
    subject_access_review,
    token_key,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Reviews:
    """The API server's answers, counted."""

    def __init__(self, answers: dict[str, Decision]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def __call__(self, token: str) -> Decision:
        self.asked.append(token)
        return self.answers[token]


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (None, None),
        ("", None),
        ("Bearer", None),
        ("Bearer   ", None),
        ("Basic dXNlcjpwYXNz", None),
        ("Bearer abc.def", "abc.def"),
        ("bearer abc", "abc"),
    ],
)
def test_only_a_bearer_token_is_a_credential(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_a_request_without_a_token_is_401_and_asks_nobody() -> None:
    reviews = Reviews({})
    decision = MetricsAccess(reviews, Clock()).check(None)
    assert decision.status == 401
    assert READER_ROLE in decision.reason
    assert reviews.asked == []


def test_a_scrape_every_15_s_asks_the_api_server_once_a_minute() -> None:
    clock = Clock()
    reviews = Reviews({"good": Decision(200)})
    access = MetricsAccess(reviews, clock)
    for _look in range(4):  # 0, 15, 30, 45 s
        assert access.check("Bearer good").allowed
        clock.now += 15
    assert reviews.asked == ["good"]
    clock.now += 1  # 61 s after the first answer
    assert access.check("Bearer good").allowed
    assert reviews.asked == ["good", "good"]


def test_a_refusal_is_kept_shorter_so_a_new_grant_takes_effect_soon() -> None:
    clock = Clock()
    reviews = Reviews({"tenant": Decision(403, "no")})
    access = MetricsAccess(reviews, clock)
    assert access.check("Bearer tenant").status == 403
    clock.now += 5
    assert access.check("Bearer tenant").status == 403
    assert len(reviews.asked) == 1
    reviews.answers["tenant"] = Decision(200)
    clock.now += 6
    assert access.check("Bearer tenant").allowed
    assert len(reviews.asked) == 2


def test_a_failed_review_is_refused_and_asked_again() -> None:
    clock = Clock()
    reviews = Reviews({"t": review_failed("connection refused")})
    access = MetricsAccess(reviews, clock)
    assert access.check("Bearer t").status == 503
    assert access.check("Bearer t").status == 503
    assert len(reviews.asked) == 2


def test_the_cache_keeps_hashes_not_tokens_and_stays_bounded() -> None:
    cache = DecisionCache(max_entries=3)
    for i in range(10):
        cache.put(token_key(f"token-{i}"), Decision(401, "bad"), 0.0)
    assert len(cache) == 3
    assert cache.get(token_key("token-9"), 1.0) is not None
    assert cache.get(token_key("token-0"), 1.0) is None
    assert all("token-" not in key for key in cache._entries)


def test_an_unauthenticated_token_is_401_naming_the_fix() -> None:
    decision = authenticated({"authenticated": False, "error": "token expired"})
    assert decision is not None and decision.status == 401
    assert "token expired" in decision.reason and READER_ROLE in decision.reason
    assert authenticated({"authenticated": True, "user": {"username": "u"}}) is None
    # Authenticated but nameless is not an identity.
    assert authenticated({"authenticated": True, "user": {}}) is not None


def test_the_access_review_asks_for_the_token_owner_on_the_non_resource_url() -> None:
    user = {
        "username": "system:serviceaccount:mon:prometheus",
        "uid": "u-1",
        "groups": ["system:serviceaccounts", "system:authenticated"],
        "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]},
    }
    review = subject_access_review(user, "/metrics", "get")
    assert review["spec"] == {
        "user": "system:serviceaccount:mon:prometheus",
        "uid": "u-1",
        "groups": ["system:serviceaccounts", "system:authenticated"],
        "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]},
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
    }


def test_only_an_allowed_and_not_denied_review_is_200() -> None:
    user = {"username": "system:serviceaccount:tenant:default"}
    assert authorized(user, {"allowed": True}, "/metrics", "get").allowed
    refused = authorized(user, {"allowed": False}, "/metrics", "get")
    assert refused.status == 403
    assert "system:serviceaccount:tenant:default may not get /metrics" in refused.reason
    assert authorized(user, {"allowed": True, "denied": True}, "/metrics", "get").status == 403
