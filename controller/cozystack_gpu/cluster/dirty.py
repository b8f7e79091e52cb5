"""What changed since the binder last read the view into its model."""

from __future__ import annotations

from dataclasses import dataclass, field

from cozystack_gpu.model import ClaimKey


@dataclass
class Dirty:
    """Names whose model input must be built again before the next pass."""

    nodes: set[str] = field(default_factory=set)
    classes: set[str] = field(default_factory=set)
    claims: set[ClaimKey] = field(default_factory=set)
    namespaces: set[str] = field(default_factory=set)
    reservations: set[ClaimKey] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(
            self.nodes or self.classes or self.claims or self.namespaces or self.reservations
        )
