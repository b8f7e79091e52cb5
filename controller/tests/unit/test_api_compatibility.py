"""The CRDs evolve without breaking what the latest release stored.

First the rules of cozystack_gpu_testkit.crd_compat on toy CRDs, each shown failing; then this
tree's CRDs against the latest release's (releases.yaml), read from git history. The stored
objects' round trip on a real API server is tests/integration/test_api_upgrade.py.
"""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from cozystack_gpu_testkit.crd_compat import Finding, breaking_changes

REPO = Path(__file__).resolve().parents[3]
CRD_DIR = "controller/cozystack_gpu/crds"

# Findings accepted on purpose, each with why stored objects stay whole, keyed by
# (CRD name/version, what changed).
ACCEPTED: dict[tuple[str, str], str] = {
    (
        "gpuclasses.gpu.cozystack.io/v1alpha1",
        ".spec.source: CEL rule '[has(self.devicePlugin), has(self.dra)].filter(x, x).size() == 1'",
    ): (
        "the source union admits the dra member (SPEC §13). It replaces the rule "
        "'[has(self.devicePlugin)].filter(x, x).size() == 1', which every stored class "
        "passed; a class without dra has the same count under both, so none fails it"
    ),
}


def _crd(spec_props: dict[str, Any], **schema: Any) -> dict[str, Any]:
    root: dict[str, Any] = {
        "type": "object",
        "properties": {"spec": {"type": "object", "properties": spec_props, **schema}},
    }
    return {
        "metadata": {"name": "toys.example.net"},
        "spec": {
            "group": "example.net",
            "scope": "Namespaced",
            "names": {"kind": "Toy", "plural": "toys"},
            "versions": [
                {
                    "name": "v1alpha1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "selectableFields": [{"jsonPath": ".spec.size"}],
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


OLD = _crd(
    {
        "size": {"type": "integer", "minimum": 1, "maximum": 8},
        "name": {"type": "string", "maxLength": 63, "pattern": "^[a-z]+$"},
        "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "note": {"type": "string", "nullable": True},
    },
    required=["size"],
)


def _spec(crd: dict[str, Any]) -> dict[str, Any]:
    version = crd["spec"]["versions"][0]
    result: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return result


def _changed(edit: Any) -> list[str]:
    new = copy.deepcopy(OLD)
    edit(new)
    return [str(f) for f in breaking_changes(OLD, new)]


def test_an_unchanged_crd_and_added_optional_fields_break_nothing() -> None:
    assert breaking_changes(OLD, OLD) == []

    def loosen(crd: dict[str, Any]) -> None:
        spec = _spec(crd)
        spec["properties"]["extra"] = {"type": "string", "maxLength": 5, "enum": ["x"]}
        spec["properties"]["size"]["maximum"] = 16
        spec["properties"]["size"]["minimum"] = 0
        spec["properties"]["mode"]["enum"].append("c")
        spec["properties"]["name"]["maxLength"] = 253
        crd["spec"]["versions"].append({"name": "v1beta1", "served": True, "storage": False})

    assert _changed(loosen) == []


CASES: dict[str, tuple[Any, str]] = {
    "field removed": (
        lambda c: _spec(c)["properties"].pop("note"),
        "toys.example.net/v1alpha1: .spec: field note removed or renamed",
    ),
    "enum value dropped": (
        lambda c: _spec(c)["properties"]["mode"].update(enum=["a"]),
        "toys.example.net/v1alpha1: .spec.mode: enum values ['b'] dropped",
    ),
    "type changed": (
        lambda c: _spec(c)["properties"]["size"].update(type="string"),
        "toys.example.net/v1alpha1: .spec.size: type changed from 'integer' to 'string'",
    ),
    "new required field": (
        lambda c: _spec(c).update(required=["size", "name"]),
        "toys.example.net/v1alpha1: .spec: required ['name'] added",
    ),
    "lower maximum": (
        lambda c: _spec(c)["properties"]["size"].update(maximum=4),
        "toys.example.net/v1alpha1: .spec.size: maximum lowered from 8 to 4",
    ),
    "lower maxLength": (
        lambda c: _spec(c)["properties"]["name"].update(maxLength=32),
        "toys.example.net/v1alpha1: .spec.name: maxLength lowered from 63 to 32",
    ),
    "a maxLength where there was none": (
        lambda c: _spec(c)["properties"]["note"].update(maxLength=32),
        "toys.example.net/v1alpha1: .spec.note: maxLength lowered from none to 32",
    ),
    "lower maxLength of list items": (
        lambda c: _spec(c)["properties"]["tags"]["items"].update(maxLength=5),
        "toys.example.net/v1alpha1: .spec.tags[]: maxLength lowered from 10 to 5",
    ),
    "higher minimum": (
        lambda c: _spec(c)["properties"]["size"].update(minimum=2),
        "toys.example.net/v1alpha1: .spec.size: minimum raised from 1 to 2",
    ),
    "narrower pattern": (
        lambda c: _spec(c)["properties"]["name"].update(pattern="^[a-z]{1,8}$"),
        "toys.example.net/v1alpha1: .spec.name: pattern changed",
    ),
    "an enum where there was none": (
        lambda c: _spec(c)["properties"]["note"].update(enum=["x"]),
        "toys.example.net/v1alpha1: .spec.note: enum ['x'] added on an existing field",
    ),
    "a new CEL rule on an existing field": (
        lambda c: _spec(c)["properties"]["size"].update(
            {"x-kubernetes-validations": [{"rule": "self % 2 == 0", "message": "even"}]}
        ),
        "toys.example.net/v1alpha1: .spec.size: CEL rule 'self % 2 == 0' added",
    ),
    "a CEL rule on an existing field's map values": (
        lambda c: _spec(c)["properties"]["labels"]["additionalProperties"].update(
            {"x-kubernetes-validations": [{"rule": "size(self) < 5"}]}
        ),
        "toys.example.net/v1alpha1: .spec.labels{}: CEL rule 'size(self) < 5' added",
    ),
    "unknown fields pruned": (
        lambda c: _spec(c)["properties"]["free"].pop("x-kubernetes-preserve-unknown-fields"),
        "toys.example.net/v1alpha1: .spec.free: x-kubernetes-preserve-unknown-fields dropped",
    ),
    "nullable taken away": (
        lambda c: _spec(c)["properties"]["note"].pop("nullable"),
        "toys.example.net/v1alpha1: .spec.note: nullable taken away",
    ),
    "default changed": (
        lambda c: _spec(c)["properties"]["mode"].update(default="b"),
        "toys.example.net/v1alpha1: .spec.mode: default changed from 'a' to 'b'",
    ),
    "list made a set": (
        lambda c: _spec(c)["properties"]["tags"].update({"x-kubernetes-list-type": "set"}),
        "toys.example.net/v1alpha1: .spec.tags: x-kubernetes-list-type 'set' added",
    ),
    "storage version changed": (
        lambda c: (
            c["spec"]["versions"].append({"name": "v1beta1", "served": True})
            or c["spec"]["versions"][0].update(storage=False)
            or c["spec"]["versions"][1].update(storage=True)
        ),
        "toys.example.net: storage version changed from v1alpha1 to v1beta1",
    ),
    "status subresource removed": (
        lambda c: c["spec"]["versions"][0].pop("subresources"),
        "toys.example.net/v1alpha1: the status subresource removed",
    ),
    "selectable field removed": (
        lambda c: c["spec"]["versions"][0].pop("selectableFields"),
        "toys.example.net/v1alpha1: selectable field .spec.size removed",
    ),
    "kind renamed": (
        lambda c: c["spec"]["names"].update(kind="Plaything"),
        "toys.example.net: names.kind changed from 'Toy' to 'Plaything'",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_breaking_change_is_found(case: str) -> None:
    edit, expected = CASES[case]
    found = _changed(edit)
    assert len(found) == 1 and found[0].startswith(expected), found


def test_a_version_removed_is_found() -> None:
    """Objects written through a version the new CRD no longer has cannot be read back."""
    old = copy.deepcopy(OLD)
    old["spec"]["versions"].append({"name": "v1alpha0", "served": True, "storage": False})
    assert [str(f) for f in breaking_changes(old, OLD)] == [
        "toys.example.net: version v1alpha0 removed: objects stored in it can no longer be read"
    ]


def test_a_transition_rule_on_an_existing_field_is_not_a_tightening() -> None:
    """A rule naming oldSelf is checked only against the object's own earlier value."""

    def immutable(crd: dict[str, Any]) -> None:
        _spec(crd)["properties"]["name"]["x-kubernetes-validations"] = [
            {"rule": "self == oldSelf", "message": "name is immutable"}
        ]

    assert _changed(immutable) == []


# --- this tree against the latest release --------------------------------------------------


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout


def _latest_release() -> tuple[str, str]:
    record = yaml.safe_load((REPO / "releases.yaml").read_text())
    newest = record["releases"][-1]
    return str(newest["version"]), str(newest["commit"])


def _crds_at(commit: str | None) -> dict[str, dict[str, Any]]:
    if commit is None:
        paths = sorted(p.relative_to(REPO).as_posix() for p in (REPO / CRD_DIR).glob("*.yaml"))
        texts = [(REPO / p).read_text() for p in paths]
    else:
        listed = _git("ls-tree", "--name-only", f"{commit}:{CRD_DIR}").split()
        texts = [_git("show", f"{commit}:{CRD_DIR}/{n}") for n in listed if n.endswith(".yaml")]
    docs = [doc for text in texts for doc in yaml.safe_load_all(text) if doc]
    return {doc["metadata"]["name"]: doc for doc in docs}


def test_the_crds_keep_every_object_the_latest_release_stored() -> None:
    version, commit = _latest_release()
    released, current = _crds_at(commit), _crds_at(None)
    assert released, f"release {version} ({commit[:12]}) has no CRDs under {CRD_DIR}"
    gone = sorted(set(released) - set(current))
    assert not gone, f"CRDs of release {version} removed from this tree: {gone}"
    findings: list[Finding] = []
    for name, old in released.items():
        findings += breaking_changes(old, current[name])
    unaccepted = [
        str(f)
        for f in findings
        if not any(f.where == w and f.what.startswith(what) for (w, what) in ACCEPTED)
    ]
    assert not unaccepted, (
        f"changes since release {version} that break objects it stored (keep the field, or"
        " add a version and migrate as docs/api-evolution.md says):\n  " + "\n  ".join(unaccepted)
    )
