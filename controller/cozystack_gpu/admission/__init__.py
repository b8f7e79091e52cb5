"""The admission webhooks every controller replica serves (SPEC.md §6, CONTRACTS.md).

- ``handlers``: every kopf decorator, and ``start`` (snapshot feed, webhook server);
- ``handle_catalog``, ``handle_vmi``, ``handle_pod``: the work of each webhook (reads,
  writes), calling the pure rules;
- ``annotation``, ``claim_rules``, ``vmi_rules``, ``pod_rules``: the rules, pure (no kopf,
  no client), unit-tested alone;
- ``access``: the reads and writes against the API server; ``feed``: every replica's
  read-only model snapshot for the claim webhook; ``server``: kopf's webhook server over
  the certificate files.
"""
