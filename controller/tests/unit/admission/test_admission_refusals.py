"""A refusal reaches the client as kopf's admission error, with its HTTP code, and is
counted by webhook and machine reason."""

from __future__ import annotations

import logging

import kopf
import pytest
from prometheus_client import REGISTRY

from cozystack_gpu.admission.errors import Refused
from cozystack_gpu.admission.handlers import _refusals
from cozystack_gpu.keys import AdmissionReason


def _count(webhook: str, reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "cozystack_gpu_admission_refusals_total", {"webhook": webhook, "reason": reason}
    )
    return value or 0.0


def test_a_refusal_is_answered_with_its_code_and_counted_by_reason() -> None:
    before = _count("mutate-vmi", "ClaimNotBound")
    with pytest.raises(kopf.AdmissionError) as answer, _refusals("mutate-vmi"):
        raise Refused("GPUClaim c is Pending, not Bound", AdmissionReason.CLAIM_NOT_BOUND, 403)
    assert answer.value.code == 403
    assert str(answer.value) == "GPUClaim c is Pending, not Bound"
    assert _count("mutate-vmi", "ClaimNotBound") == before + 1


def test_kopf_logs_a_refusal_at_info_not_error() -> None:
    import logging

    from cozystack_gpu.admission.handlers import _refusals_are_not_errors

    record = logging.LogRecord(
        "kopf.objects", logging.ERROR, __file__, 1,
        "Webhook 'validate-gpuclaim' failed permanently: tenant-a has 2 of 2 in use", None, None,
    )  # fmt: skip
    assert _refusals_are_not_errors(record)
    assert (record.levelno, record.levelname) == (logging.INFO, "INFO")
    crash = logging.LogRecord("kopf.objects", logging.ERROR, __file__, 1, "boom", None, None)
    assert _refusals_are_not_errors(crash) and crash.levelno == logging.ERROR


def _errors(webhook: str) -> float:
    value = REGISTRY.get_sample_value("cozystack_gpu_admission_errors_total", {"webhook": webhook})
    return value or 0.0


def test_an_answer_that_could_not_be_computed_is_counted_as_an_error() -> None:
    from kubernetes.client.rest import ApiException

    before = _errors("mutate-pod")
    with pytest.raises(kopf.AdmissionError) as answer, _refusals("mutate-pod"):
        raise ApiException(status=503, reason="Service Unavailable")
    assert answer.value.code == 500
    assert _errors("mutate-pod") == before + 1
    with pytest.raises(kopf.AdmissionError), _refusals("mutate-pod"):
        raise Refused("feed stopped", AdmissionReason.REPLICA_CANNOT_CHECK, 500)
    assert _errors("mutate-pod") == before + 2
    with pytest.raises(KeyError), _refusals("mutate-pod"):
        raise KeyError("a bug")
    assert _errors("mutate-pod") == before + 3
    # A refusal by a rule is the webhook working: not an error.
    with pytest.raises(kopf.AdmissionError), _refusals("mutate-pod"):
        raise Refused("over budget", AdmissionReason.CLAIM_NOT_BOUND, 403)
    assert _errors("mutate-pod") == before + 3


def test_an_answer_that_could_not_be_computed_is_a_warning_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The admission-errors alert sends the hoster to the log, and kopf's own line of a
    refusal is lowered to INFO: the webhook says at WARNING why it could not answer (an API
    failure, a 5xx refusal), and a tenant's refusal stays out of the warnings."""
    from kubernetes.client.rest import ApiException

    with caplog.at_level(logging.INFO, logger="cozystack_gpu.admission.handlers"):
        with pytest.raises(kopf.AdmissionError), _refusals("validate-gpuclass"):
            raise ApiException(status=403, reason="Forbidden")
        with pytest.raises(kopf.AdmissionError), _refusals("validate-gpuclaim"):
            raise Refused("its watch feed stopped", AdmissionReason.CLAIM_NOT_BOUND, 500)
        with pytest.raises(kopf.AdmissionError), _refusals("validate-gpuclaim"):
            raise Refused("over budget", AdmissionReason.CLAIM_NOT_BOUND, 403)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "webhook validate-gpuclass could not answer: the API server answered 403 Forbidden",
        "webhook validate-gpuclaim could not answer: its watch feed stopped",
    ]
