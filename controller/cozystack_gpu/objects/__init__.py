"""The vocabulary of the API objects every part reads: accessors, timestamps, the claims
annotation, launcher pod readers, finalizer and attachment patches, attachments and their
verdicts, pod usage, volumes, the translation of objects into the model's inputs, and the
devices, ResourceClaims and VMI entries of the ``dra`` source.
Below the admission webhooks and the binder, which both speak it; it imports only the keys
and the model."""

from collections.abc import Mapping
from typing import Any

# An API object as the API server returns it, read and never changed in place.
Obj = Mapping[str, Any]
# An API object a reader holds and may change (a watch cache entry, a body being built).
MutableObj = dict[str, Any]
