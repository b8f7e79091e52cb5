"""The node layout schema: every refusal names its entry, and valid layouts come out canonical."""

from __future__ import annotations

import json

import pytest
from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_layout_schema
from ansible_collections.cozystack.gpu.tests.unit.plugins.module_utils.layout_cases import (
    UUID,
)


def problems_of(document):
    with pytest.raises(gpu_layout_schema.LayoutError) as caught:
        gpu_layout_schema.parse_layout(document)
    return caught.value.problems


def layout(*gpus, **extra):
    return gpu_layout_schema.parse_layout(dict(gpus=list(gpus), **extra))


class TestSchema:
    @pytest.mark.parametrize("index", [0, 3, "1", " 2 "])
    def test_an_index_instead_of_an_address_is_refused(self, index):
        problems = problems_of({"gpus": [{"address": index, "mode": "passthrough"}]})
        assert len(problems) == 1
        assert problems[0].startswith("gpus[0] (")
        assert "looks like a GPU index" in problems[0]
        assert "PCI address" in problems[0]

    def test_a_duplicate_is_found_after_the_domain_is_canonicalised(self):
        problems = problems_of(
            {
                "gpus": [
                    {"address": "01:00.0", "mode": "passthrough"},
                    {"address": "0000:01:00.0", "mode": "passthrough"},
                ]
            }
        )
        assert problems == [
            "gpus[1] (0000:01:00.0): duplicate of gpus[0] (01:00.0) (both are 0000:01:00.0)"
        ]

    def test_nvidia_smis_eight_digit_domain_is_the_same_gpu(self):
        problems = problems_of(
            {
                "gpus": [
                    {"address": "00000000:41:00.0", "mode": "passthrough"},
                    {"address": "41:00.0", "mode": "passthrough"},
                ]
            }
        )
        assert "duplicate of gpus[0] (00000000:41:00.0)" in problems[0]

    def test_gpus_in_other_pci_domains_are_different_gpus(self):
        parsed = layout(
            {"address": "0000:41:00.0", "mode": "passthrough"},
            {"address": "0001:41:00.0", "mode": "passthrough"},
        )
        assert [g.address for g in parsed.gpus] == ["0000:41:00.0", "0001:41:00.0"]

    @pytest.mark.parametrize(
        "key,value",
        [("profile", "NVIDIA L40S-24C"), ("count", 2), ("vfs", {"41:00.4": "NVIDIA L40S-24C"})],
    )
    def test_a_profile_for_a_passthrough_gpu_is_refused(self, key, value):
        problems = problems_of(
            {"gpus": [{"address": "41:00.0", "mode": "passthrough", key: value}]}
        )
        assert problems == [
            f"gpus[0] (41:00.0): {key} is set for a passthrough GPU; a passthrough GPU goes to a VM"
            " whole and carries no vGPU profile"
        ]

    def test_a_gpu_uuid_is_accepted_and_lower_cased(self):
        parsed = layout({"address": "GPU-" + UUID[4:].upper(), "mode": "passthrough"})
        assert parsed.gpus[0].address == UUID

    def test_a_type_id_instead_of_a_profile_name_is_refused(self):
        problems = problems_of({"gpus": [{"address": "41:00.0", "mode": "vgpu", "profile": 1151}]})
        assert "is a type ID; name the profile" in problems[0]
        assert problems[0].startswith("gpus[0] (41:00.0)")

    @pytest.mark.parametrize(
        "entry,expected",
        [
            ({"address": "41:00.0", "mode": "vgpu"}, "exactly one of profile"),
            (
                {"address": "41:00.0", "mode": "vgpu", "profile": "A", "vfs": {"41:00.4": "A"}},
                "exactly one of profile",
            ),
            ({"address": "41:00.0", "mode": "gpu"}, "mode must be passthrough or vgpu"),
            ({"address": "41:00.0", "mode": "vgpu", "profile": "A", "count": 0}, "count must be"),
            (
                {"address": "41:00.0", "mode": "vgpu", "profile": "A", "count": True},
                "count must be",
            ),
            ({"address": "41:00.0", "mode": "passthrough", "prof1le": "A"}, "unknown keys prof1le"),
            ({"address": "slot-3", "mode": "passthrough"}, "neither a PCI address"),
            ({"mode": "passthrough"}, "address is required"),
            ({"address": "41:00.0", "mode": "vgpu", "vfs": {"7": "A"}}, "vfs[7]"),
        ],
    )
    def test_malformed_entries_are_refused_by_name(self, entry, expected):
        problems = problems_of({"gpus": [entry]})
        assert any(expected in p for p in problems), problems
        assert all(p.startswith("gpus[0]") for p in problems)

    def test_every_bad_entry_is_reported_not_just_the_first(self):
        problems = problems_of(
            {
                "gpus": [
                    {"address": 0, "mode": "passthrough"},
                    {"address": "18:00.0", "mode": "passthrough"},
                    {"address": "2a:00.0", "mode": "passthrough", "profile": "X"},
                ]
            }
        )
        assert [p.split(" ", 1)[0] for p in problems] == ["gpus[0]", "gpus[2]"]

    def test_a_vf_listed_twice_is_refused(self):
        problems = problems_of(
            {
                "gpus": [
                    {"address": "41:00.0", "mode": "vgpu", "vfs": {"41:00.4": "A"}},
                    {"address": "81:00.0", "mode": "vgpu", "vfs": {"0000:41:00.4": "B"}},
                ]
            }
        )
        assert "duplicate of gpus[0] (41:00.0): vfs[41:00.4]" in problems[0]

    def test_top_level_shape_and_unknown_keys(self):
        assert problems_of([]) == ["layout: must be a mapping with a 'gpus' list"]
        assert problems_of({"gpus": {}, "node": "x"}) == [
            "layout: unknown keys node (known: name, gpus)",
            "layout: gpus must be a list",
        ]

    def test_a_valid_layout_round_trips_canonical(self):
        parsed = layout(
            {"address": "18:00.0", "mode": "passthrough"},
            {"address": "41:00.0", "mode": "vgpu", "profile": " NVIDIA L40S-24C ", "count": 2},
            {"address": "81:00.0", "mode": "vgpu", "vfs": {"81:00.5": "B", "81:00.4": "A"}},
            name="mixed",
        )
        assert parsed.to_dict() == {
            "name": "mixed",
            "gpus": [
                {"address": "0000:18:00.0", "mode": "passthrough"},
                {
                    "address": "0000:41:00.0",
                    "mode": "vgpu",
                    "profile": "NVIDIA L40S-24C",
                    "count": 2,
                },
                {
                    "address": "0000:81:00.0",
                    "mode": "vgpu",
                    "vfs": {"0000:81:00.4": "A", "0000:81:00.5": "B"},
                },
            ],
        }

    def test_layout_files_are_json_or_yaml(self, tmp_path):
        (tmp_path / "l.json").write_text(
            json.dumps({"gpus": [{"address": "18:00.0", "mode": "passthrough"}]})
        )
        (tmp_path / "l.yaml").write_text("gpus:\n  - address: '18:00.0'\n    mode: passthrough\n")
        for name in ("l.json", "l.yaml"):
            parsed = gpu_layout_schema.parse_layout(
                gpu_layout_schema.load_layout_file(str(tmp_path / name))
            )
            assert parsed.gpus[0].address == "0000:18:00.0"
