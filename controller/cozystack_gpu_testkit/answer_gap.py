"""The longest time a probe went unanswered while something changed under it (a rollout).

A probe is tried every period from a thread; the gap is measured from one answer to the
next, so a probe that hangs on a process going away counts as gap too. When the change is
over, the probing goes on until the gap in progress closes with an answer: a rollout whose
last step (the new replica ready) comes the moment the webhook answers again would
otherwise stop the probes inside the gap and lose it whole.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Gap:
    """``with Gap(answered) as gap: ...``; then ``gap.longest_s``."""

    answered: Callable[[], bool]
    period_s: float = 0.1
    # How long the exit waits for the gap in progress to close; past that it counts to then.
    close_within_s: float = 120.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    longest_s: float = 0.0
    refused: int = 0
    probes: int = 0
    # Whether the last probe was answered (a gap in progress closed) when the probing ended.
    closed: bool = True
    _closing: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Gap:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, *_exc: object) -> None:
        if exc_type is not None:  # the change failed: nothing reads the gap, so no wait
            self.close_within_s = 0.0
        self._closing.set()
        assert self._thread is not None
        self._thread.join(self.close_within_s + 10)

    def _run(self) -> None:
        last_answer = self.clock()
        closing_deadline: float | None = None
        while True:
            self.probes += 1
            try:
                answered = self.answered()
            except Exception:  # a probe that breaks answered nothing
                answered = False
            now = self.clock()
            if answered:
                # Two prompt answers are a period apart: that much is no gap.
                self.longest_s = max(self.longest_s, now - last_answer - self.period_s)
                last_answer = now
            else:
                self.refused += 1
            self.closed = answered
            if self._closing.is_set():
                if closing_deadline is None:
                    closing_deadline = now + self.close_within_s
                if answered:
                    return
                if now >= closing_deadline:  # never answered again: the gap runs to here
                    self.longest_s = max(self.longest_s, now - last_answer - self.period_s)
                    return
            self.sleep(self.period_s)
