"""The one exception the webhooks' work raises for a refusal; handlers turn it into
``kopf.AdmissionError``, so the work modules need no kopf import."""

from __future__ import annotations


class Refused(Exception):
    """An admission refusal: ``message`` is what the API client shows, ``code`` its HTTP
    status (400 for input that cannot be read, 403 for a rule, 409 for a race lost), and
    ``reason`` its machine reason (keys.AdmissionReason or the model's Reason), counted in
    the refusals metric and explained in docs/troubleshooting.md."""

    def __init__(self, message: str, reason: str, code: int = 403) -> None:
        super().__init__(message)
        self.message = message
        self.reason = str(getattr(reason, "value", reason))
        self.code = code
