"""Merge patches both the webhooks and the binder write: an attachment cleared, a
finalizer added or removed."""

from __future__ import annotations

from typing import Any

from cozystack_gpu.objects import Obj
from cozystack_gpu.objects.translate import meta

# The status fields of an attachment, as a merge patch that clears them all.
ATTACHMENT_CLEARED: dict[str, Any] = {
    "attachedTo": None,
    "attachedToUID": None,
    "attachmentID": None,
    "attachedAt": None,
}


def finalizers_of(obj: Obj) -> list[str]:
    return [str(f) for f in meta(obj).get("finalizers") or []]


def finalizer_patch(obj: Obj, finalizer: str, present: bool) -> dict[str, Any] | None:
    """A merge patch that adds or removes one finalizer, or None when nothing changes.

    A merge patch replaces the whole list, so it carries the resourceVersion it was built
    from: a finalizer another controller added meanwhile makes the write fail (409) rather
    than vanish.
    """
    current = finalizers_of(obj)
    if (finalizer in current) == present:
        return None
    wanted = [*current, finalizer] if present else [f for f in current if f != finalizer]
    return {
        "metadata": {
            "resourceVersion": meta(obj).get("resourceVersion"),
            "finalizers": wanted,
        }
    }
