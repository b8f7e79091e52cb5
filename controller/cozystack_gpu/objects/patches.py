"""Merge patches both the webhooks and the binder write: an attachment cleared, a
finalizer added or removed."""

from __future__ import annotations

from typing import Any

from cozystack_gpu.objects import Obj
from cozystack_gpu.objects.translate import meta


def attachment(
    vmi_name: str | None,
    *,
    uid: str | None = None,
    attachment_id: str | None = None,
    at: str | None = None,
) -> dict[str, Any]:
    """A claim's attachment status fields, every one of them; None is a field not set. The
    VMI webhook writes an attachment with its attachment id (the VMI has no uid yet), the
    binder a template claim's with its VMI's uid; both say when."""
    return {"attachedTo": vmi_name, "attachedToUID": uid, "attachmentID": attachment_id,
            "attachedAt": at}  # fmt: skip


# The status fields of an attachment, as a merge patch that clears them all.
ATTACHMENT_CLEARED: dict[str, Any] = attachment(None)


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
