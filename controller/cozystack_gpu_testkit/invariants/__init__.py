"""The product's invariants, checked on what the real API server holds.

One checker for every test that races, restarts or breaks the binder (the fault suite, its
long form ``benchmarks/fault_bench.py``, the replica tests). It reads every object it needs
from the API server, never from a controller's memory, and judges two kinds of rule:

At every look (``check``), whatever is going on:
- no node holds more units of a resource name than it has (claims Bound or Attached there,
  Lost claims whose VMI still runs there, raw-name pods (every pod but the one launcher pod
  of a live VMI with claims), and what those launcher pods use beyond their claims there,
  against the smaller of the node's allocatable and its GPUNode devices);
- no budget key of a tenant or any of its ancestors counts more units than its limit;
- no claim is bound twice: once it holds a node, it keeps that node and its ``boundAt``
  unless a decision moved it (its Bound condition says Moved, Rebound or Reattached: the
  planner's packing moves unattached holds); a new node shown as a fresh "Bound" is a
  second bind;
- no attached claim moves: while attached to one VMI it stays on the node that VMI was
  placed on (its launcher pod bound there, or the VMI reporting it); a starting VM's set may
  be placed again before that (a cordon between the bind and the pin);
- no started launcher pod runs elsewhere than its claims;
- the start path (``_start_path``): every running VMI's claims (the held ones its claims
  annotation names, and its template claims) are Attached to it, by name and, where the
  claim records one, by uid, and carry the protection finalizer; a template claim it uses
  is its own (labelled, its VMI's uid as controlling owner, the entry's class and count);
  no claim serves two running VMIs; no launcher pod that uses claims is ungated without a
  ``metadata.name`` pin, in every required term, to the node its claims hold.

A "running VMI" is one whose launcher pod (owned by it, by uid) is bound to a node and that
is marked Running. What the leader writes after the start (a template claim's attachment,
the finalizer, an attachment back from Lost once the node is Ready again) gets
``start_grace_s`` from the VMI's Running transition or the node's Ready transition; held
claims are attached by the VMI webhook before the VMI is stored, so they get none. The
release of a window's claim at the window's end gets the same grace: until then the claim
holds nothing, and a window booked from that end counts in full.

Once the cluster has settled (``settled``), also:
- every order is judged: Bound or Attached on a node, or Pending (Lost) with a Bound
  condition that gives a reason and a message (a template claim may wait at the gate
  with a Placed condition instead);
- usage records exist exactly for the ordered Bound and Attached claims, owned by the claim
  (its uid) and counting its class and units;
- every Bound or Attached claim of a ``dra`` class has one ResourceClaim of its own,
  allocated (if at all) only devices of its node, and none outlives its claim.

For a ``dra`` class the capacity rule counts the class's units against the devices of the
node's ResourceSlices that its DeviceClass and selectors match.

The history rules compare each claim version with every earlier one, so a checker lives as
long as the run it watches; ``watching`` looks in a background thread and follows every
version of every claim through a watch, so a short-lived violation during a fault is seen,
not only the state after it.

A driver that starts VMs itself (the lifecycle fuzz's) also judges, with reads of its own
and at its own pace (``driver_looks``): no started VM stranded at a Ready node that keeps
refusing its pinned pod, no launcher pod let go asking more than its claims hold, and, once
settled, no template claim left behind by its VMI; and it names what it sees admitted that
``forbidden`` refuses (``RAW_ADMITTED``, ``FORGED_ADMITTED``).

The package: ``state`` (what a look reads: ``read_state``, ``State``, ``Scope``, and the
``Violation`` it reports, with every rule's name), ``reading`` (how the rules read objects:
the binder's pod roles, owners, pins, timestamps), ``checker`` (``Invariants``: the rules,
the looks and the watch), ``driver_looks`` (a driver's own looks).
"""

from cozystack_gpu_testkit.invariants.checker import (
    CAPACITY_LOSS_GRACE_S,
    START_GRACE_S,
    Invariants,
)
from cozystack_gpu_testkit.invariants.reading import required_pins
from cozystack_gpu_testkit.invariants.state import (
    ATTACHED_MOVED,
    BOUND_TWICE,
    BUDGET,
    CAPACITY,
    DRA_NOT_FOLLOWED,
    FOREIGN_TEMPLATE,
    FORGED_ADMITTED,
    NOT_ATTACHED,
    NOT_JUDGED,
    ORPHANED,
    POD_ELSEWHERE,
    RAW_ADMITTED,
    RECORDS,
    SERVES_TWO,
    STRANDED,
    SURPLUS,
    UNGATED_BY_TENANT,
    UNPINNED,
    UNPROTECTED,
    Scope,
    State,
    Violation,
    read_state,
)

__all__ = [
    "ATTACHED_MOVED",
    "BOUND_TWICE",
    "BUDGET",
    "CAPACITY",
    "CAPACITY_LOSS_GRACE_S",
    "DRA_NOT_FOLLOWED",
    "FOREIGN_TEMPLATE",
    "FORGED_ADMITTED",
    "NOT_ATTACHED",
    "NOT_JUDGED",
    "ORPHANED",
    "POD_ELSEWHERE",
    "RAW_ADMITTED",
    "RECORDS",
    "SERVES_TWO",
    "START_GRACE_S",
    "STRANDED",
    "SURPLUS",
    "UNGATED_BY_TENANT",
    "UNPINNED",
    "UNPROTECTED",
    "Invariants",
    "Scope",
    "State",
    "Violation",
    "read_state",
    "required_pins",
]
