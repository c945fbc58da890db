"""The output processor's extra cost for a request's first output (``first_output_overhead_s``):
paid once per request, on the step that delivers its first token, on both paths."""

from __future__ import annotations

import dataclasses

import pytest

from engine.core.events import EventKind
from tests.sim.helpers import SIMPLE_FRONTEND, events, simulate, workload


def delivered(result, req: str) -> list[float]:
    """Delivery times of the steps that gave ``req`` its tokens, in order."""
    log = result.event_log
    steps = dict(zip(log.delivered_columns()["step_id"], log.delivered_columns()["time_s"],
                     strict=True))
    runs = log.token_runs()
    index = log.req_ids.index(req)
    return [steps[s] for r, first, n in zip(runs["req_index"], runs["first_step"],
                                              runs["num_tokens"], strict=True)
            if r == index for s in range(first, first + n)]


@pytest.mark.parametrize("fast_path", [True, False])
def test_only_the_first_output_pays(fast_path: bool) -> None:
    w = workload([0.0, 0.0], [20, 1], [6, 4])  # the second prompt is one token: decode-shaped
    base = simulate(w, fast_path=fast_path)
    fe = dataclasses.replace(SIMPLE_FRONTEND, first_output_overhead_s=0.004)
    paid = simulate(w, frontend=fe, fast_path=fast_path)
    # request 1 reaches the engine a step after request 0 (one API server): step 1 delivers
    # request 0's first token, step 2 request 1's first with request 0's second — each of
    # those steps 4 ms later; the output processor is free again by the next step (12 ms)
    extra = {"0": [0.004, 0.004, 0, 0, 0, 0], "1": [0.004, 0, 0, 0]}
    for req, expected in extra.items():
        before, after = delivered(base, req), delivered(paid, req)
        assert [a - b for a, b in zip(after, before, strict=True)] == pytest.approx(
            expected, abs=1e-12)
    ev = {(e[0], e[1]): e[2] for e in events(paid)}
    assert ev[("1", EventKind.DELIVERED.name)] == pytest.approx(delivered(paid, "1")[-1])
    assert events(simulate(w, frontend=fe, fast_path=not fast_path)) == events(paid)
