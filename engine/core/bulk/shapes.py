"""The two cursors a bulk run's shape computation advances iteration by iteration.

``DecodeSet`` knows which requests decode in the next iteration to shape and their contexts'
sum and max; ``FinishOrder`` lists the requests by finish iteration and counts those the shaped
iterations have finished. Each writes only its own state; ``BulkRun`` (``run.py``) drives them
and reads their public attributes (each iteration reads them; the methods run only when a
request leaves, joins or finishes).
"""

from __future__ import annotations

from typing import Final

NO_ITERATION: Final = 1 << 60  # "never" (a native int when compiled: below 2**62)


def insert_sorted(values: list[int], v: int) -> None:
    """Insert ``v`` into the sorted ``values`` after its equals."""
    lo, hi = 0, len(values)
    while lo < hi:
        mid = (lo + hi) // 2
        if values[mid] <= v:
            lo = mid + 1
        else:
            hi = mid
    values.insert(lo, v)


def _insert_by_key(order: list[int], lo: int, i: int, keys: list[int]) -> None:
    """Insert index ``i`` into ``order[lo:]`` (sorted by ``keys``) after its equals."""
    hi = len(order)
    key = keys[i]
    while lo < hi:
        mid = (lo + hi) // 2
        if keys[order[mid]] <= key:
            lo = mid + 1
        else:
            hi = mid
    order.insert(lo, i)


def order_by(keys: list[int], indexes: list[int], bits: int) -> list[int]:
    """Packed sort keys ``key << bits | index`` of ``indexes`` by ``keys`` (ties by index),
    sorted: sorting ints is faster than sorting tuples."""
    packed = [(keys[i] << bits) | i for i in indexes]
    packed.sort()
    return packed


class DecodeSet:
    """The requests decoding in the next iteration to shape.

    A request decoding from iteration ``start`` with context ``c`` has context ``c + k − start``
    in iteration ``k``: the set keeps the offsets ``c − start``, sorted, and their sum, so that
    iteration's context sum is ``offset_sum + n·k`` and its max ``offsets[-1] + k`` (``n`` =
    ``len(offsets)``). Requests leave at their decode end: ``end_order`` lists the decoding
    requests by decode end (ties in running order), ``end_ptr`` those gone so far and
    ``next_end`` the next one's end (a cheap test of whether ``retire_through`` has work).
    The per-request lists it is given belong to the run; the set only reads them.
    """

    __slots__ = (
        "_context_at_start", "_decode_end", "_decode_start", "end_order", "end_ptr", "next_end",
        "offset_sum", "offsets",
    )

    def __init__(
        self,
        offsets: list[int],
        end_order: list[int],
        decode_start: list[int],
        decode_end: list[int],
        context_at_start: list[int],
    ) -> None:
        offsets.sort()
        total = 0
        for v in offsets:
            total += v
        self.offsets = offsets
        self.offset_sum = total
        self.end_order = end_order
        self.end_ptr = 0
        self._decode_start = decode_start
        self._decode_end = decode_end
        self._context_at_start = context_at_start
        self.next_end = decode_end[end_order[0]] if end_order else NO_ITERATION

    def retire_through(self, k: int) -> None:
        """Remove the requests whose decode interval ends by iteration ``k``."""
        order, ends = self.end_order, self._decode_end
        ptr = self.end_ptr
        while ptr < len(order) and ends[order[ptr]] <= k:
            i = order[ptr]
            v = self._context_at_start[i] - self._decode_start[i]
            self.offsets.remove(v)
            self.offset_sum -= v
            ptr += 1
        self.end_ptr = ptr
        self.next_end = ends[order[ptr]] if ptr < len(order) else NO_ITERATION

    def join(self, offset: int) -> None:
        """A request starts decoding (the prefiller, after its last chunk)."""
        insert_sorted(self.offsets, offset)
        self.offset_sum += offset

    def expect_end(self, i: int) -> None:
        """Request ``i`` will decode until its decode end: order it among those not gone."""
        _insert_by_key(self.end_order, self.end_ptr, i, self._decode_end)
        self.next_end = self._decode_end[self.end_order[self.end_ptr]]


class FinishOrder:
    """Request indexes by finish iteration (ties in running order; ``NO_ITERATION``: not known
    yet, last), and how many of them the shaped iterations finished (``consumed``)."""

    __slots__ = ("consumed", "iters", "next_finish", "order")

    def __init__(self, order: list[int], iters: list[int]) -> None:
        self.order = order
        self.iters = iters
        self.consumed = 0
        self.next_finish = iters[0] if iters else NO_ITERATION  # the first not consumed

    def add_unknown(self, i: int) -> None:
        """Request ``i`` (the last in running order) finishes at an iteration not known yet."""
        self.order.append(i)
        self.iters.append(NO_ITERATION)
        self.next_finish = self.iters[self.consumed]

    def consume_through(self, k: int) -> int:
        """How many requests not counted yet finish by the update of iteration ``k``."""
        iters = self.iters
        ptr = self.consumed
        while ptr < len(iters) and iters[ptr] <= k:
            ptr += 1
        count = ptr - self.consumed
        self.consumed = ptr
        self.next_finish = iters[ptr] if ptr < len(iters) else NO_ITERATION
        return count

    def place(self, i: int, finish: int) -> None:
        """Request ``i``, listed with an unknown finish, finishes at ``finish``: move it among
        the entries not consumed, after its equals (it is last in running order)."""
        order, iters = self.order, self.iters
        pos = order.index(i)
        del order[pos]
        del iters[pos]
        lo, hi = self.consumed, len(iters)
        while lo < hi:
            mid = (lo + hi) // 2
            if iters[mid] <= finish:
                lo = mid + 1
            else:
                hi = mid
        order.insert(lo, i)
        iters.insert(lo, finish)
        self.next_finish = iters[self.consumed] if self.consumed < len(iters) else NO_ITERATION

    def finishing(self, k: int) -> list[int]:
        """Indexes of the requests finishing at the update of iteration ``k``, in running
        order."""
        iters = self.iters
        lo, hi = 0, len(iters)
        while lo < hi:  # first position with iteration >= k
            mid = (lo + hi) // 2
            if iters[mid] < k:
                lo = mid + 1
            else:
                hi = mid
        end = lo
        while end < len(iters) and iters[end] == k:
            end += 1
        return self.order[lo:end]

    def counts(self, num_iterations: int) -> list[int]:
        """Requests finishing at each update of iterations ``0..num_iterations − 1``."""
        counts = [0] * num_iterations
        for f in self.iters:
            if f >= num_iterations:
                break
            counts[f] += 1
        return counts
