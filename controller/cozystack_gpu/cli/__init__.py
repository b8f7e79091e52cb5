"""``kubectl gpu``: a kubectl plugin that explains claims, VMs and reservations, lists claims
and reservations, and shows GPU usage.

The edge (``main``, ``kube``) parses kubectl's flags, reads the API as the user (or as whom
``--as`` names) and prints; everything it prints is computed by pure functions here
(``explain_claim``, ``explain_vm``, ``explain_reservation``, ``list_claims``,
``list_reservations``, ``top``, ``whatif``, ``text``) from the objects read, so
the unit tests feed them dicts and the answers never depend on a live cluster. A read the
user is not allowed is no error: the answer says less, and never guesses what it could not
read (another tenant's names, node names a tenant cannot list).
"""
