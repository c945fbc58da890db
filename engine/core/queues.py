"""Waiting queues: FCFS (a deque) and priority (a binary heap), as vLLM's ``request_queue.py``.

FCFS: ``add`` appends at the tail, ``pop``/``peek`` use the head, ``prepend_request`` puts one
request at the head and ``prepend_requests`` does ``extendleft`` — so a list ends up *reversed*
at the front (callers build it with ``appendleft`` to restore the original order).

Priority: ordered by ``(priority, arrival_time, req_id)``; "prepend" is a plain push (a heap has
no front), and iteration yields sorted order without disturbing the heap.

A scheduling policy of its own (``engine/core/policy.py``) brings any queue satisfying
``RequestQueue``; the scheduler holds it inside a ``PolicyRequestQueue``, so that the queue it
calls on every step is always one of three classes of this module (native calls when compiled).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Protocol

from engine.core.request import Request


class RequestQueue(Protocol):
    """The operations the scheduler needs from a waiting queue.

    ``pop_request`` returns the request ``peek_request`` would (the scheduler peeks, decides,
    then pops); "prepend" puts a preempted request back where it resumes first (a queue with
    an order of its own may put it where that order says); iteration does not change it.
    """

    def add_request(self, request: Request) -> None: ...
    def pop_request(self) -> Request: ...
    def peek_request(self) -> Request: ...
    def prepend_request(self, request: Request) -> None: ...
    def prepend_requests(self, requests: Iterable[Request]) -> None: ...
    def remove_requests(self, requests: Iterable[Request]) -> None: ...
    def __len__(self) -> int: ...
    def __bool__(self) -> bool: ...
    def __iter__(self) -> Iterator[Request]: ...


class FCFSRequestQueue:
    """First come, first served."""

    __slots__ = ("_dq",)

    def __init__(self) -> None:
        self._dq: deque[Request] = deque()

    def add_request(self, request: Request) -> None:
        self._dq.append(request)

    def pop_request(self) -> Request:
        return self._dq.popleft()

    def peek_request(self) -> Request:
        if not self._dq:
            raise IndexError("peek from an empty queue")
        return self._dq[0]

    def prepend_request(self, request: Request) -> None:
        self._dq.appendleft(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        self._dq.extendleft(requests)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        drop = set(map(id, requests))
        kept = [r for r in self._dq if id(r) not in drop]
        self._dq.clear()
        self._dq.extend(kept)

    def __len__(self) -> int:
        return len(self._dq)

    def __bool__(self) -> bool:
        return bool(self._dq)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._dq)


class PriorityRequestQueue:
    """Smallest ``(priority, arrival_time, req_id)`` first."""

    __slots__ = ("_counter", "_heap")

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, str, int, Request]] = []
        self._counter = itertools.count()

    def add_request(self, request: Request) -> None:
        heapq.heappush(
            self._heap,
            (request.priority, request.arrival_time, request.req_id, next(self._counter), request),
        )

    def pop_request(self) -> Request:
        if not self._heap:
            raise IndexError("pop from an empty heap")
        return heapq.heappop(self._heap)[-1]

    def peek_request(self) -> Request:
        if not self._heap:
            raise IndexError("peek from an empty heap")
        return self._heap[0][-1]

    def prepend_request(self, request: Request) -> None:
        self.add_request(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self.add_request(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        drop = set(map(id, requests))
        self._heap = [e for e in self._heap if id(e[-1]) not in drop]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        heap = list(self._heap)
        while heap:
            yield heapq.heappop(heap)[-1]


class PolicyRequestQueue:
    """A scheduling policy's own queue, behind the interface of this module's queues."""

    __slots__ = ("_queue",)

    def __init__(self, queue: RequestQueue) -> None:
        self._queue = queue

    def add_request(self, request: Request) -> None:
        self._queue.add_request(request)

    def pop_request(self) -> Request:
        return self._queue.pop_request()

    def peek_request(self) -> Request:
        return self._queue.peek_request()

    def prepend_request(self, request: Request) -> None:
        self._queue.prepend_request(request)

    def prepend_requests(self, requests: Iterable[Request]) -> None:
        self._queue.prepend_requests(requests)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        self._queue.remove_requests(requests)

    def __len__(self) -> int:
        return len(self._queue)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


#: The queue types the scheduler holds.
WaitingQueue = FCFSRequestQueue | PriorityRequestQueue | PolicyRequestQueue


def as_waiting_queue(queue: RequestQueue) -> WaitingQueue:
    """``queue`` as the scheduler holds it: this module's own queues as they are, any other
    inside a ``PolicyRequestQueue``."""
    if isinstance(queue, FCFSRequestQueue | PriorityRequestQueue | PolicyRequestQueue):
        return queue
    return PolicyRequestQueue(queue)


def create_request_queue(policy: str) -> FCFSRequestQueue | PriorityRequestQueue:
    if policy == "fcfs":
        return FCFSRequestQueue()
    if policy == "priority":
        return PriorityRequestQueue()
    raise ValueError(f"unknown scheduling policy {policy!r}; valid: 'fcfs', 'priority'")
