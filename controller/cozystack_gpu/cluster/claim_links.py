"""The claims each VMI's name links, for the cluster view: those whose status names it as
``attachedTo``, and the template claims it owns. Together they cover the GPU requests of
the VMI's launcher pods."""

from __future__ import annotations

from cozystack_gpu.model import ClaimKey
from cozystack_gpu.objects import MutableObj, pod_usage

Key = tuple[str, str]  # (namespace, VMI name)


class ClaimLinks:
    def __init__(self) -> None:
        self._attached: dict[Key, set[ClaimKey]] = {}
        self._templates_of: dict[Key, set[ClaimKey]] = {}

    def on_claim(self, key: ClaimKey, old: MutableObj | None, new: MutableObj | None) -> set[Key]:
        """Take the claim's links from ``old`` to ``new``; the VMIs either links."""
        served: set[Key] = set()
        for obj, add in ((old, False), (new, True)):
            if obj is None:
                continue
            target = (obj.get("status") or {}).get("attachedTo")
            if target:
                served.add(_link(self._attached, (key.namespace, str(target)), key, add))
            owner = pod_usage.template_owner(obj)
            if owner is not None:
                served.add(_link(self._templates_of, (key.namespace, owner), key, add))
        return served

    def attached_to(self, vmi: Key) -> set[ClaimKey]:
        return set(self._attached.get(vmi, ()))

    def members(self, vmi: Key) -> set[ClaimKey]:
        """The claims attached to the VMI or owned by it as templates."""
        return self._attached.get(vmi, set()) | self._templates_of.get(vmi, set())

    def attachments(self) -> list[tuple[Key, frozenset[ClaimKey]]]:
        """Claims by the VMI their status names as attachedTo (namespace, VMI name)."""
        return [(vmi, frozenset(members)) for vmi, members in self._attached.items()]


def _link(index: dict[Key, set[ClaimKey]], vmi: Key, claim: ClaimKey, add: bool) -> Key:
    members = index.setdefault(vmi, set())
    (members.add if add else members.discard)(claim)
    if not members:
        del index[vmi]
    return vmi
