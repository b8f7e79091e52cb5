"""Every name read from a tenant's object is judged as the API server judges it: the whole
string, never a prefix. A ``$`` anchor also matches before a trailing newline, so a claim
template named ``"gpu\\n"`` passed the annotation reader, the VM and VMI were admitted, and
the leader sent about 360 refused creates a second for a claim name the API server can never
accept (issue 41, item 3)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cozystack_gpu import keys
from cozystack_gpu.objects import annotation

# The API server's own rules (k8s.io/apimachinery validation): RFC 1123 subdomain and label.
_API_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_API_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

NAMES = st.one_of(
    st.text(alphabet="abz09-.\n\r\t \x00", max_size=12),
    st.from_regex(_API_LABEL, fullmatch=True).map(lambda n: n + "\n"),
    st.from_regex(_API_SUBDOMAIN, fullmatch=True),
)


def api_accepts_label(name: str) -> bool:
    return len(name) <= 63 and _API_LABEL.fullmatch(name) is not None


def api_accepts_subdomain(name: str) -> bool:
    return len(name) <= 253 and _API_SUBDOMAIN.fullmatch(name) is not None


@pytest.mark.parametrize("name", ["gpu\n", "gpu\r\n", "gpu\n\n", "\ngpu"])
def test_a_template_name_with_a_line_break_is_refused(name: str) -> None:
    raw = json.dumps({"claimTemplates": [{"name": name, "class": "h100", "count": 1}]})
    with pytest.raises(annotation.AnnotationError, match="is not a DNS label"):
        annotation.parse(raw)


@pytest.mark.parametrize("name", ["vm-gpu\n", "a.b\n"])
def test_a_held_claim_name_with_a_line_break_is_refused(name: str) -> None:
    with pytest.raises(annotation.AnnotationError, match="is not a GPUClaim name"):
        annotation.parse(json.dumps({"claims": [name]}))


def test_a_class_name_with_a_line_break_is_no_class_name() -> None:
    assert not keys.is_dns_label("h100\n")
    raw = json.dumps({"claimTemplates": [{"name": "gpu", "class": "h100\n"}]})
    with pytest.raises(annotation.AnnotationError, match="is not a GPUClass name"):
        annotation.parse(raw)


@given(NAMES)
def test_the_annotation_reader_accepts_exactly_the_names_the_api_server_accepts(
    name: str,
) -> None:
    claims = json.dumps({"claims": [name]})
    templates = json.dumps({"claimTemplates": [{"name": name, "class": "h100"}]})
    assert (annotation.problem_of({keys.ANNOTATION_CLAIMS: claims}) is None) == (
        api_accepts_subdomain(name)
    )
    assert (annotation.problem_of({keys.ANNOTATION_CLAIMS: templates}) is None) == (
        api_accepts_label(name)
    )
    assert keys.is_dns_label(name) == (api_accepts_label(name) and name != "total")


def test_an_annotation_beyond_the_limits_is_refused_with_the_limit_named() -> None:
    # 494 KiB values were admitted and kept by every replica (issue 41, item 4).
    huge = json.dumps({"claims": [f"c{i:06d}" for i in range(60_000)]})
    with pytest.raises(annotation.AnnotationError, match=f"more than the {annotation.MAX_BYTES}"):
        annotation.parse(huge)
    many = json.dumps({"claims": [f"c{i}" for i in range(annotation.MAX_ENTRIES + 1)]})
    with pytest.raises(annotation.AnnotationError, match=f"{annotation.MAX_ENTRIES} allowed"):
        annotation.parse(many)
    at_limit = json.dumps({"claims": [f"c{i}" for i in range(annotation.MAX_ENTRIES)]})
    assert len(annotation.parse(at_limit).claims) == annotation.MAX_ENTRIES


def test_what_tenants_write_keeps_no_memory_beyond_the_readers_bound() -> None:
    # Every VM gone, its value may stay only in a cache of small values, of bounded count.
    before = annotation._cached.cache_info().currsize
    for i in range(50):
        big = json.dumps({"claims": [f"vm-{i}-disk-gpu-{j:04d}" for j in range(60)]})
        assert len(big) > annotation.CACHED_MAX_BYTES
        assert annotation.request_of({keys.ANNOTATION_CLAIMS: big}) is not None
    assert annotation._cached.cache_info().currsize == before, "large values are not kept"
    for i in range(annotation.CACHED + 500):
        annotation.request_of({keys.ANNOTATION_CLAIMS: json.dumps({"claims": [f"c{i}"]})})
    assert annotation._cached.cache_info().currsize <= annotation.CACHED
