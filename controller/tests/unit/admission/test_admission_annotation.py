"""The claims annotation is read strictly: every malformed value is refused with a message
naming what is wrong and showing the expected format."""

from __future__ import annotations

import json

import pytest

from cozystack_gpu.objects.annotation import (
    EXPECTED_FORMAT,
    AnnotationError,
    ClaimsRequest,
    TemplateEntry,
    encode,
    parse,
)


def test_a_well_formed_annotation_names_claims_in_order_and_templates() -> None:
    raw = json.dumps(
        {
            "claims": ["b", "a"],
            "claimTemplates": [{"name": "gpu", "class": "l40s-24c", "count": 2}],
        }
    )
    assert parse(raw) == ClaimsRequest(("b", "a"), (TemplateEntry("gpu", "l40s-24c", 2),))


def test_a_template_without_count_orders_one_unit() -> None:
    raw = '{"claimTemplates": [{"name": "gpu", "class": "h100"}]}'
    assert parse(raw).templates == (TemplateEntry("gpu", "h100", 1),)


def test_encode_is_the_inverse_of_parse() -> None:
    request = ClaimsRequest(("a",), (TemplateEntry("x", "h100", 3),))
    assert parse(encode(request)) == request


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("not json", "not JSON (Expecting value at position 0)"),
        ("[]", "it is a JSON list, not an object"),
        ("null", "it is a JSON null, not an object"),
        ('{"claim": ["a"]}', "unknown member(s) 'claim'"),
        ("{}", "it names no claim and no claim template"),
        ('{"claims": []}', "it names no claim and no claim template"),
        ('{"claims": "a"}', "'claims' must be a list of GPUClaim names"),
        ('{"claims": ["A_b"]}', 'claims[0] = "A_b" is not a GPUClaim name'),
        ('{"claims": [1]}', "claims[0] = 1 is not a GPUClaim name"),
        ('{"claims": ["a", "a"]}', "claims[1] names GPUClaim a twice"),
        ('{"claimTemplates": {}}', "'claimTemplates' must be a list of objects"),
        (
            '{"claimTemplates": ["x"]}',
            "claimTemplates[0] must be an object with name, class and count",
        ),
        (
            '{"claimTemplates": [{"name": "x", "class": "h", "count": 1, "size": 2}]}',
            "claimTemplates[0] has unknown member(s) 'size'",
        ),
        ('{"claimTemplates": [{"name": "x"}]}', "claimTemplates[0] lacks class"),
        ('{"claimTemplates": [{"count": 1}]}', "claimTemplates[0] lacks class, name"),
        (
            '{"claimTemplates": [{"name": "X", "class": "h", "count": 1}]}',
            'claimTemplates[0].name = "X" is not a DNS label',
        ),
        (
            '{"claimTemplates": [{"name": "x", "class": "h", "count": 1},'
            ' {"name": "x", "class": "h", "count": 1}]}',
            "claimTemplates[1].name x is used twice",
        ),
        (
            '{"claimTemplates": [{"name": "x", "class": "total", "count": 1}]}',
            'claimTemplates[0].class = "total" is not a GPUClass name',
        ),
        (
            '{"claimTemplates": [{"name": "x", "class": "h", "count": 0}]}',
            "claimTemplates[0].count = 0 is not a whole number >= 1",
        ),
        (
            '{"claimTemplates": [{"name": "x", "class": "h", "count": true}]}',
            "claimTemplates[0].count = true is not a whole number >= 1",
        ),
        (
            '{"claimTemplates": [{"name": "x", "class": "h", "count": 1.5}]}',
            "claimTemplates[0].count = 1.5 is not a whole number >= 1",
        ),
    ],
)
def test_a_malformed_annotation_is_refused_with_the_problem_and_the_format(
    raw: str, problem: str
) -> None:
    with pytest.raises(AnnotationError) as refused:
        parse(raw)
    assert str(refused.value) == (
        f"annotation gpu.cozystack.io/claims is malformed: {problem}; "
        f"expected JSON like {EXPECTED_FORMAT}"
    )
