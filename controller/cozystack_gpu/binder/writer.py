"""The binder's API writes, done by a few threads so round trips overlap.

Decisions stay serial in the binder loop; only the HTTP calls run here, each a typed call
(``calls``) sent at its priority. Binds go before everything else (a status condition on a
waiting claim, an Event, a class status), so a burst of refusals never delays a bind.

Every call reports back to the loop through its queue, whatever happens to the request: the
loop holds a claim "in flight" until its write reports, and a claim held for ever blocks
every later plan that would touch it. So an API answer, a broken connection (urllib3's
``MaxRetryError``, ``ProtocolError``), a timeout and a bug alike end in an ``Answer``.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu.binder.calls.base import (
    Answer,
    Call,
    CallKey,
    Clients,
    Outcome,
    Priority,
    WriterStopped,
    describe,
)
from cozystack_gpu.leader import Term

log = logging.getLogger(__name__)

# After a request that did not reach the server (or a 429/5xx), a worker pauses before its
# next job, doubling up to the maximum: while the server restarts, the loop's re-decided
# writes are not fired at it in a tight loop. Any answer resets the pause.
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 2.0


def _transient(exc: BaseException) -> bool:
    """The server was not reached, or asked us to slow down."""
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        return status == 429 or status >= 500
    return True


class Writer:
    def __init__(
        self,
        api: client.ApiClient,
        results: queue.Queue[Any],
        workers: int,
        may_send: Callable[[], bool] = lambda: True,
        write_deadline_s: float | None = None,
        term: Callable[[], Term | None] = lambda: None,
    ) -> None:
        # Every write carries the deadline for the API server (``DeadlineApiClient``): none
        # of this leader's writes lands after another leader may start, once it reached the
        # server; a claim status write carries the leader's term besides (``claims.fenced``),
        # for one the network held until after that.
        self.clients = Clients.of(api, write_deadline_s, term)
        self._results = results
        # Asked before every request: a replica whose leadership ended sends nothing it had
        # queued, even before the binder is stopped (that waits for the elector's thread).
        self._may_send = may_send
        self._jobs: queue.PriorityQueue[tuple[int, int, Call | None]] = queue.PriorityQueue()
        self._seq = itertools.count()
        # The newest queued call of each key whose type supersedes: older ones go unsent.
        self._newest: dict[CallKey, int] = {}
        self._newest_lock = threading.Lock()
        self._stopped = threading.Event()
        self._threads = [
            threading.Thread(target=self._work, name=f"writer-{i}", daemon=True)
            for i in range(workers)
        ]
        self.sent: Counter[str] = Counter()  # requests sent, by what they write

    @property
    def status_writes(self) -> int:
        """Claim status writes sent, for the benchmark's writes per bind."""
        return self.sent["claim-decision"] + self.sent["claim-note"]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Ends the workers; calls still queued answer ``WriterStopped`` without being sent.

        The binder stops when this replica stops leading, and a replica that does not lead
        must not write: the next leader decides again from what the API server holds.
        """
        self._stopped.set()
        for _thread in self._threads:
            # None sorts after every call of the same priority; the highest number ends last.
            self._jobs.put((Priority.EVENT + 1, next(self._seq), None))
        for thread in self._threads:
            thread.join(timeout=5)

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        return tuple(self._threads)

    def pending(self) -> int:
        return self._jobs.qsize()

    def send(self, call: Call) -> None:
        seq = next(self._seq)
        if call.supersedes:
            with self._newest_lock:
                self._newest[call.key] = seq
        self._jobs.put((call.priority, seq, call))

    def _superseded(self, call: Call, seq: int) -> bool:
        if not call.supersedes:
            return False
        with self._newest_lock:
            newest = self._newest.get(call.key)
            if newest == seq:
                del self._newest[call.key]
            return newest is not None and newest > seq

    def _work(self) -> None:
        pause = 0.0
        while True:
            _priority, seq, call = self._jobs.get()
            if call is None:
                return
            if self._superseded(call, seq):
                self._results.put(Answer(call, Outcome.SUPERSEDED))
                continue
            if self._stopped.is_set():
                self._results.put(self._refused(call, WriterStopped("the writer stopped")))
                continue
            if not self._may_send():
                self._results.put(
                    self._refused(call, WriterStopped("this replica no longer leads"))
                )
                continue
            try:
                self.sent[call.what] += 1
                got = call.request(self.clients)
                answer = got if isinstance(got, Answer) else Answer(call, Outcome.WRITTEN, got)
                pause = 0.0
            except Exception as exc:  # an answer, a broken connection, a timeout or a bug
                answer = self._refused(call, exc)
                if _transient(exc):
                    pause = min(max(pause * 2, BACKOFF_FIRST_S), BACKOFF_MAX_S)
                else:
                    pause = 0.0
            self._results.put(answer)
            if pause:
                self._stopped.wait(pause)

    def _refused(self, call: Call, exc: Exception) -> Answer:
        try:
            return call.refused(exc, self.clients)
        except Exception as again:  # reading the object again failed too
            log.debug("%s %s: %s, then %s", call.what, call.path, describe(exc), describe(again))
            return Answer(call, Outcome.FAILED, error=describe(exc))
