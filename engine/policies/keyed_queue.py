"""A waiting queue ordered by a key the policy computes when a request is queued.

Smallest key first, ties in queueing order. A request's key is computed when it enters the
queue (``add_request``, or ``prepend_request`` after a preemption) and stays fixed while it
waits: waiting requests make no progress, so keys of progress (remaining tokens, the next
token's deadline) are exact. Removal is lazy (a removed entry is skipped when it surfaces).
A queued request is in the queue once (queueing it again is a bug of the caller).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator

from engine.core.request import Request

#: A request's queue key (compared as tuples of numbers).
Key = Callable[[Request], tuple[float, ...]]


class KeyedRequestQueue:
    """``engine.core.queues.RequestQueue`` ordered by ``key`` (smallest first)."""

    def __init__(self, key: Key) -> None:
        self._key = key
        self._heap: list[tuple[tuple[float, ...], int, Request]] = []
        self._counter = itertools.count()
        self._live: dict[int, int] = {}  # id() of each queued request -> its entry's number

    def add_request(self, request: Request) -> None:
        seq = next(self._counter)
        self._live[id(request)] = seq
        heapq.heappush(self._heap, (self._key(request), seq, request))

    def _top(self) -> Request:
        heap, live = self._heap, self._live
        while heap and live.get(id(heap[0][2])) != heap[0][1]:
            heapq.heappop(heap)  # removed while queued
        if not heap:
            raise IndexError("peek from an empty queue")
        return heap[0][2]

    def peek_request(self) -> Request:
        return self._top()

    def pop_request(self) -> Request:
        request = self._top()
        heapq.heappop(self._heap)
        del self._live[id(request)]
        return request

    def prepend_request(self, request: Request) -> None:
        self.add_request(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self.add_request(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self._live.pop(id(request), None)

    def __len__(self) -> int:
        return len(self._live)

    def __bool__(self) -> bool:
        return bool(self._live)

    def __iter__(self) -> Iterator[Request]:
        live = self._live
        entries = sorted(e for e in self._heap if live.get(id(e[2])) == e[1])
        return iter([e[2] for e in entries])
