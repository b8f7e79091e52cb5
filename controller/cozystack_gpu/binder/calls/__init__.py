"""The binder's writes, one type per call.

A part builds a call (what to write, on which object) and hands it to the binder; the
writer's threads send it (``request``) at its ``priority`` and turn whatever happens into an
``Answer`` (``refused`` for an exception); the loop applies the answer to the view
(``apply``) and, where the part keeps books on it, tells the part whether it landed
(``heard``). So a part never holds an API client and never writes into the view, and a new
kind of write is one class in one of these modules.

``key`` names the object a call writes: the loop counts the calls of a key that are out
(a part asks before writing it again), and a call whose type ``supersedes`` is dropped
unsent when a newer one of the same key is queued behind it: its body is stale and the
newer one says all it would have.

Every request carries ``base.REQUEST_TIMEOUT_S``, so a request the server never answers ends too.

The calls live by what they write: ``base`` (the call, its answer and priority), ``claims``
(decisions and notes on claims), ``start_path`` (launcher pods, template claims, VMIs) and
``reports`` (finalizers, statuses, settings, usage records, Events).
"""
