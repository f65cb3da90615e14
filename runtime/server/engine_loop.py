"""The engine loop: one background thread owns the LLMEngine and is the only code that touches it.

HTTP handlers never call the engine. They hand work over through a thread-safe inbox (add, abort) and
receive events through a sink, a callable the loop calls from its thread (the app turns it into
loop.call_soon_threadsafe onto a per-call asyncio queue). Admission is decided here, against the
engine's real waiting queue, so "the waiting queue is full" is exact rather than estimated.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from quantkit.errors import QuantkitError
from quantkit.runtime.engine import EngineStats, LLMEngine
from quantkit.runtime.outputs import RequestOutput
from quantkit.runtime.sampling_params import SamplingParams
from quantkit.runtime.sequence import Sequence, SequenceStatus
from quantkit.runtime.server.metrics import ServerMetrics

log = logging.getLogger("quantkit.runtime.server")
IDLE_WAIT_S = 0.25  # how often an idle loop wakes up to refresh gauges and notice stop()


@dataclass(frozen=True)
class Admitted:
    """Every request of the call is queued on the engine."""


@dataclass(frozen=True)
class Refused:
    """The waiting queue is full; nothing of the call was queued."""
    num_waiting: int


@dataclass(frozen=True)
class Failed:
    """The engine raised (a bug): the request is gone."""
    message: str


Event = Admitted | Refused | Failed | RequestOutput
Sink = Callable[[Event], None]


@dataclass
class Submission:
    request_id: str
    token_ids: list[int]
    params: SamplingParams


@dataclass
class _Live:
    seq: Sequence
    sink: Sink
    scheduled: bool = False
    last_token_time: float | None = None


@dataclass
class _Add:
    submissions: list[Submission]
    sink: Sink


@dataclass
class _Abort:
    request_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class LoopStats:
    """What /stats serves: the engine's numbers and the loop's admission counts, captured together."""
    engine: EngineStats
    admitted_requests: int
    refused_calls: int

    def as_dict(self) -> dict:
        return self.engine.as_dict() | {"admitted_requests": self.admitted_requests,
                                        "refused_calls": self.refused_calls}


class EngineLoop:
    def __init__(self, engine: LLMEngine, metrics: ServerMetrics, max_waiting: int):
        self.engine = engine
        self.metrics = metrics
        self.max_waiting = max_waiting
        self.error: str | None = None  # set when the engine raised; the server is then unhealthy
        self.num_admitted = 0  # requests queued on the engine (written by the loop thread only)
        self.num_refused = 0  # HTTP calls refused because the waiting queue was full
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[str, _Live] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="quantkit-engine", daemon=True)
        self._stats = LoopStats(engine.stats(), 0, 0)

    # --- called from any thread ---
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._inbox.put(None)
        self._thread.join(timeout=30)

    @property
    def healthy(self) -> bool:
        return self._thread.is_alive() and self.error is None

    @property
    def stats(self) -> LoopStats:
        """The latest snapshot (safe to read from any thread); see _publish for when it is taken."""
        return self._stats

    def submit(self, submissions: list[Submission], sink: Sink) -> None:
        self._inbox.put(_Add(submissions, sink))
        if self.error is not None:  # the loop is gone (or going): nobody may read the inbox again
            sink(Failed(self.error))

    def abort(self, request_ids: list[str]) -> None:
        self._inbox.put(_Abort(list(request_ids)))

    # --- the engine thread ---
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._drain(block=not self.engine.has_unfinished_requests())
                if self.engine.has_unfinished_requests():
                    self._step()
                else:
                    self._publish(stepped=False)
            self._close("the server is shutting down")
        except Exception as exc:  # a bug in the engine: fail every request, then report unhealthy
            log.exception("engine loop stopped")
            self._close(f"{type(exc).__name__}: {exc}")

    def _close(self, reason: str) -> None:
        """Fail every live and queued request. error is set first, so a submit that comes later fails itself."""
        self.error = reason
        for live in self._live.values():
            live.sink(Failed(reason))
        self._live.clear()
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Add):
                item.sink(Failed(reason))

    def _drain(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=IDLE_WAIT_S) if block else self._inbox.get_nowait()
            while True:
                if isinstance(item, _Add):
                    self._add(item)
                elif isinstance(item, _Abort):
                    for request_id in item.request_ids:
                        self._abort(request_id)
                item = self._inbox.get_nowait()
        except queue.Empty:
            pass

    def _add(self, item: _Add) -> None:
        num_waiting = len(self.engine.scheduler.waiting)
        if num_waiting + len(item.submissions) > self.max_waiting:
            self.num_refused += 1
            self._publish(stepped=False)
            item.sink(Refused(num_waiting))
            return
        added = []
        try:
            for sub in item.submissions:
                self.engine.add_request(sub.token_ids, sub.params, request_id=sub.request_id)
                added.append(sub.request_id)
        except QuantkitError as exc:  # the app validates first; this is the engine's own last word
            for request_id in added:
                self.engine.abort(request_id)
            item.sink(Failed(str(exc)))
            return
        for request_id in added:
            self._live[request_id] = _Live(self.engine.requests[request_id], item.sink)
        self.num_admitted += len(added)
        self._publish(stepped=False)
        item.sink(Admitted())

    def _abort(self, request_id: str) -> None:
        live = self._live.pop(request_id, None)
        out = self.engine.abort(request_id)
        if live is not None and out is not None:
            self.metrics.on_output(out, None)
            self.metrics.on_finished(out_time(live.seq) - live.seq.arrival_time)

    def _step(self) -> None:
        started = time.perf_counter()
        outputs = self.engine.step()
        now = time.perf_counter()
        for live in self._live.values():
            if not live.scheduled and (live.seq.status is not SequenceStatus.WAITING or live.seq.num_computed_tokens):
                live.scheduled = True
                self.metrics.on_scheduled(max(started - live.seq.arrival_time, 0.0))
        deliveries = []
        for out in outputs:
            live = self._live.get(out.request_id)
            if live is None:
                continue
            gap = None if live.last_token_time is None else now - live.last_token_time
            live.last_token_time = now
            self.metrics.on_output(out, gap)
            if out.finished:
                del self._live[out.request_id]
                self.metrics.on_finished(out_time(live.seq) - live.seq.arrival_time)
            deliveries.append((live.sink, out))
        self._publish(stepped=True)
        for sink, out in deliveries:
            sink(out)

    def _publish(self, stepped: bool) -> None:
        """Snapshot the engine for /stats and the gauges, after a change's metrics and before any sink hears
        of it: a client told of its admission or a token that then reads /stats must see that change, and a
        snapshot without a request must come with that request's metrics counted."""
        stats = self.engine.stats()
        self._stats = LoopStats(stats, self.num_admitted, self.num_refused)
        self.metrics.on_step(stats, stats.last_step_tokens if stepped else None)


def out_time(seq: Sequence) -> float:
    return seq.finish_time or time.perf_counter()
