"""The handlers kopf serves are the webhooks CONTRACTS.md names: URL path = "/" + handler
id, the object kind, the operations, validating or mutating, side effects."""

from __future__ import annotations

import kopf
from kopf._cogs.structs.references import Resource
from kopf._core.intents import registries
from kopf._core.intents.causes import WebhookType

from cozystack_gpu import keys
from cozystack_gpu.admission import handlers

CONTRACT = {
    # id (path): (group, version, plural, operations, type, side effects)
    "validate-gpuclaim": (
        keys.GROUP, keys.VERSION, keys.PLURAL_CLAIMS, ["CREATE", "UPDATE"], "validating", False
    ),
    "validate-gpureservation": (
        keys.GROUP, keys.VERSION, keys.PLURAL_RESERVATIONS, ["CREATE"], "validating", False
    ),
    "mutate-gpuclaim": (
        keys.GROUP, keys.VERSION, keys.PLURAL_CLAIMS, ["CREATE"], "mutating", False
    ),
    "validate-gpuclass": (
        keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, ["CREATE", "UPDATE"], "validating", False
    ),
    "validate-vm": (
        "kubevirt.io", "v1", "virtualmachines", ["CREATE", "UPDATE"], "validating", False
    ),
    "mutate-vmi": ("kubevirt.io", "v1", "virtualmachineinstances", ["CREATE"], "mutating", False),
    "mutate-pod": ("", "v1", "pods", ["CREATE"], "mutating", False),
}  # fmt: skip


def test_every_webhook_of_the_contract_is_served_and_nothing_else() -> None:
    assert handlers.validate_gpuclaim is not None  # the import registered the decorators
    served = {
        str(h.id): h
        for h in registries.get_default_registry()._webhooks.get_all_handlers()
        if h.fn.__module__ == handlers.__name__
    }
    assert set(served) == set(CONTRACT)
    for handler_id, (group, version, plural, operations, kind, effects) in CONTRACT.items():
        handler = served[handler_id]
        assert handler.selector is not None
        assert handler.selector.check(Resource(group=group, version=version, plural=plural))
        others = Resource(group=group, version=version, plural="others")
        assert not handler.selector.check(others), handler_id
        assert list(handler.operations or []) == operations, handler_id
        assert handler.reason == WebhookType(kind), handler_id
        assert bool(handler.side_effects) == effects, handler_id
        # The chart renders the configurations: none is kopf-managed or lenient.
        assert not handler.ignore_failures, handler_id


def test_a_new_claim_gets_the_protection_finalizer_beside_its_own() -> None:
    """The claim webhook's mutating half (where no MutatingAdmissionPolicy serves): every
    new claim carries claim-protection, a tenant's own finalizers kept; one that has it is
    left alone."""
    for given, wanted in (
        (None, [keys.FINALIZER_CLAIM]),
        (["example.com/mine"], ["example.com/mine", keys.FINALIZER_CLAIM]),
    ):
        patch = kopf.Patch()
        body = kopf.Body({"metadata": {"name": "c", **({"finalizers": given} if given else {})}})
        handlers.mutate_gpuclaim(body=body, patch=patch)
        assert patch["metadata"]["finalizers"] == wanted
    patch = kopf.Patch()
    protected = kopf.Body({"metadata": {"name": "c", "finalizers": [keys.FINALIZER_CLAIM]}})
    handlers.mutate_gpuclaim(body=protected, patch=patch)
    assert not patch
