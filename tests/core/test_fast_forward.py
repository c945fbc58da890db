"""The bulk fast path equals step-by-step execution, exactly.

From random engine states (sync and async scheduling, prefix caching on and off, shared
prefixes, tight KV caches, waiting queues blocked by max_num_seqs or the token budget, a last
request still prefilling, an arrival the run's first step admits), applying K iterations in
bulk must leave the scheduler, the KV cache (block ids, free-queue order, hash map) and the
event records exactly as K calls of begin_step/finish_step would.
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine.core.bulk import find
from engine.core.bulk.records import RunTiming
from engine.core.bulk.run import BulkRun
from engine.core.config import CacheConfig, EngineConfig, SchedulerConfig
from engine.core.engine_core import EngineCore
from engine.core.hashing import PrecomputedBlockHasher, TokenBlockHasher
from engine.core.outputs import AdmissionBlocker, ModelRunnerOutput, SchedulerOutput
from engine.core.request import Request, SamplingParams
from engine.core.scheduler import Scheduler

TOKEN = 7


def _runner_output(out: SchedulerOutput) -> ModelRunnerOutput:
    return ModelRunnerOutput(
        {r: [TOKEN] for r in out.num_scheduled_tokens if r not in out.partial_prefill_req_ids}
    )


def _iterate(core: EngineCore, now: float) -> None:
    """One engine-loop iteration, as every driver runs it."""
    out = core.begin_step(now)
    del out
    if core.must_finish_step():
        oldest = core.oldest_in_flight()
        core.finish_step(oldest, _runner_output(oldest), now)


def _timing(k: int, t0: float) -> RunTiming:
    ts = [t0 + i for i in range(k)]
    return RunTiming(ts, ts, ts, ts, [0.0] * k)


def _state(core: EngineCore) -> dict:
    sched = core.scheduler
    pool = sched.kv_cache_manager.block_pool
    reqs = {}
    for req_id, r in sched.requests.items():
        reqs[req_id] = (
            r.status, r.num_computed_tokens, r.num_tokens, list(r.output_token_ids),
            r.num_output_placeholders, r.num_in_flight_tokens, r.num_stale_output_tokens,
            list(r.block_ids), r.num_cached_blocks, list(r.block_hashes), r.is_prefill_chunk,
        )
    table = {h: (v if isinstance(v, int) else list(v)) for h, v in pool.hash_to_block.items()}
    flights = [
        (
            f.sched_out.step_id, dict(f.sched_out.num_scheduled_tokens), f.sched_out.batch_shape,
            f.sched_out.scheduled_cached_reqs.new_block_ids,
            f.sched_out.scheduled_cached_reqs.num_computed_tokens,
            f.sched_out.scheduled_cached_reqs.num_output_tokens,
            str(f.sched_out.admission_blocker),
        )
        for f in core._in_flight
    ]
    log = core.event_log
    steps = log.steps_columns()
    comparable_steps = {
        k: list(v) for k, v in steps.items()
        if k not in ("schedule_time_s", "execute_start_s", "execute_end_s", "update_time_s",
                     "cost_s")
    }
    runs = log.token_runs()
    token_runs = sorted(
        zip(runs["req_index"], runs["first_step"], runs["num_tokens"], strict=True)
    )
    return {
        "requests": reqs,
        "running": [r.req_id for r in sched.running],
        "waiting": [r.req_id for r in sched.waiting],
        "num_steps": sched.num_steps,
        "prev": sched.prev_step_scheduled_req_ids,
        "finished": sched.finished_req_ids,
        "ref_cnt": list(pool.ref_cnt),
        "block_hash": list(pool.block_hash),
        "in_map": list(pool.in_map),
        "free_queue": pool.free_queue.get_all_free_blocks(),
        "table": table,
        "in_flight": flights,
        "steps": comparable_steps,
        "token_runs": token_runs,
        # the log as a reader sees it, in order (iter_events' order must not depend on how
        # the steps were applied)
        "events": [(e.req_id, e.kind, e.time_s, e.payload) for e in log.iter_events()],
        "first_tokens": sorted(core._first_token_seen),
    }


def _build(seed: int) -> tuple[EngineCore, list[Request], random.Random]:
    rng = random.Random(seed)
    knobs = random.Random(-seed - 1)  # the rarer scheduler knobs, drawn apart
    bs = rng.choice([2, 4, 16])
    max_num_seqs = rng.choice([2, 3, 8, 16])
    budget = max(max_num_seqs, rng.choice([8, 32, 256]))
    max_model_len = rng.choice([64, 200, 4096])
    chunked = knobs.random() < 0.8 or budget < max_model_len  # (off needs a budget >= it)
    config = EngineConfig(
        scheduler=SchedulerConfig(
            max_num_batched_tokens=budget,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            async_scheduling=rng.random() < 0.5,
            policy=rng.choice(["fcfs", "priority"]),
            enable_chunked_prefill=chunked,
            long_prefill_token_threshold=knobs.choice([0, 0, 0, 3, 12]),
            scheduler_reserve_full_isl=knobs.random() < 0.7,
        ),
        cache=CacheConfig(
            num_gpu_blocks=rng.choice([30, 60, 400]),
            block_size=bs,
            enable_prefix_caching=rng.random() < 0.7,
            watermark=knobs.choice([0.0, 0.0, 0.05, 0.2]),
        ),
    )
    core = EngineCore(config)
    prefixes = [[rng.randrange(100, 200) for _ in range(bs * rng.randint(0, 3))] for _ in range(2)]
    requests = []
    max_len = config.scheduler.max_model_len
    for i in range(rng.randint(1, 12)):
        prompt = rng.choice(prefixes) + [rng.randrange(200, 900) for _ in range(rng.randint(1, 30))]
        prompt = prompt[: max_len - 2]
        params = SamplingParams(max_tokens=rng.randint(1, 60))
        hasher: TokenBlockHasher | PrecomputedBlockHasher
        if rng.random() < 0.5:
            hasher = TokenBlockHasher(bs)
            req = Request(str(i), sampling_params=params, prompt_token_ids=prompt,
                          arrival_time=float(i), priority=rng.randint(0, 2), block_hasher=hasher)
        else:
            keys = [("p", tuple(prompt[: (j + 1) * bs])) for j in range(len(prompt) // bs)]
            hasher = PrecomputedBlockHasher(bs, keys, unique_id=i)
            req = Request(str(i), sampling_params=params, num_prompt_tokens=len(prompt),
                          arrival_time=float(i), priority=rng.randint(0, 2), block_hasher=hasher)
        requests.append(req)
    return core, requests, rng


def _drive(seed: int, k_frac: float) -> Counter[str]:
    """Run a random engine; wherever a bulk run is found (half the time), apply ``k_frac`` of
    its iterations in bulk to a copy, step the original as many times, and require the same
    state. Returns what kinds of runs were compared."""
    core, requests, rng = _build(seed)
    pending = list(requests)
    seen: Counter[str] = Counter()
    for step in range(400):
        while pending and rng.random() < 0.4:
            core.add_request(pending.pop(0), float(step))
        if not pending and not core.has_work():
            break
        run = core.find_bulk_run(TOKEN)
        if run is not None and rng.random() < 0.5:
            k = 1 + int(k_frac * (run.max_iterations - 1))
            bulk = copy.deepcopy(core)
            bulk_run = bulk.find_bulk_run(TOKEN)
            assert bulk_run is not None
            bulk.apply_bulk_run(bulk_run, k, TOKEN, _timing(k, float(step)))
            for i in range(k):
                _iterate(core, float(step + i))
            assert _state(bulk) == _state(core)
            seen["runs"] += 1
            if run.prefill_index >= 0:
                seen["prefill"] += 1
                seen["prefill completed"] += run.prefill_done_iteration < k
            seen["admission"] += run.admitted
            seen["head blocked"] += run.head_blocked_while >= 0
            seen["async"] += run.is_async
            continue
        _iterate(core, float(step))
    # The whole run completes and leaks nothing.
    pool = core.scheduler.kv_cache_manager.block_pool
    if not core.has_work() and not pending:
        assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
    return seen


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), k_frac=st.floats(0.0, 1.0))
@example(seed=63, k_frac=0.58)  # a run closed token runs in another order than its steps would
def test_bulk_run_equals_step_by_step(seed: int, k_frac: float) -> None:
    _drive(seed, k_frac)


def test_every_kind_of_run_is_compared() -> None:
    """The random states do reach each kind of run (a guard against a fast path that silently
    stopped applying): plain decodes, a prefilling last request (finishing its prefill inside
    the run or not), an absorbed admission, a head of the queue refused for KV blocks, under
    both schedulings."""
    seen: Counter[str] = Counter()
    for seed in range(40):
        seen += _drive(seed, (seed % 7) / 6)
    assert seen["runs"] >= 300
    assert seen["prefill"] >= 60 and seen["prefill completed"] >= 30
    assert seen["admission"] >= 30
    assert seen["head blocked"] >= 10
    assert 0.2 * seen["runs"] <= seen["async"] <= 0.8 * seen["runs"]


def _spied_searches(
    verdicts: list[bool], judge: Callable[[bool, BulkRun | None, int, Counter[str]], None]
) -> Counter[str]:
    """Drive 400 random workloads, searching for a run before every step; where a spy put a
    verdict in ``verdicts`` during the search, ``judge`` gets it with the run found, the seed
    and the counter it fills (returned)."""
    seen: Counter[str] = Counter()
    for seed in range(400):
        core, requests, rng = _build(seed)
        pending = list(requests)
        for step in range(400):
            while pending and rng.random() < 0.4:
                core.add_request(pending.pop(0), float(step))
            if not pending and not core.has_work():
                break
            verdicts.clear()
            run = core.find_bulk_run(TOKEN)
            if verdicts:
                judge(verdicts[0], run, seed, seen)
            _iterate(core, float(step))
    return seen


def test_admission_precheck_refuses_only_what_the_plan_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """find_bulk_run plans no admission when ``_admission_hits`` says the head of the waiting
    queue cannot fit; that must be a necessary condition of the plan: with the precheck's
    verdict ignored, the full path (set-up, then the plan) plans no admission either (a run
    may still keep the head waiting: ``_head_stays_blocked``)."""
    verdicts: list[bool] = []
    precheck = find._admission_hits

    def spy(sched: Scheduler, num_reqs: int) -> tuple[object, int]:
        verdicts.append(precheck(sched, num_reqs) is None)
        kv = sched.kv_cache_manager
        return kv.get_computed_blocks(sched.waiting.peek_request())

    def judge(cannot_fit: bool, run: BulkRun | None, seed: int, seen: Counter[str]) -> None:
        seen["cannot fit" if cannot_fit else "may fit"] += 1
        if cannot_fit:
            assert run is None or not run.admitted, seed
        elif run is not None:
            seen["admitted"] += run.admitted

    monkeypatch.setattr(find, "_admission_hits", spy)
    seen = _spied_searches(verdicts, judge)
    assert seen["cannot fit"] >= 50 and seen["admitted"] >= 50, seen


def test_a_run_is_not_set_up_only_where_the_plan_would_refuse_a_second_admission(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """find_bulk_run returns no run, without setting one up, when ``_admits_another`` says the
    first schedule() would go on to try a second waiting request; that must be a sufficient
    condition of the plan's refusal: with the verdict ignored, the full path (set-up, then
    the plan) finds no run either."""
    verdicts: list[bool] = []
    check = find._admits_another

    def spy(sched: Scheduler, num_reqs: int, num_hits: int) -> bool:
        verdicts.append(check(sched, num_reqs, num_hits))
        return False

    def judge(another: bool, run: BulkRun | None, seed: int, seen: Counter[str]) -> None:
        seen["another" if another else "one"] += 1
        if another:
            assert run is None, seed
        elif run is not None:
            seen["admitted"] += run.admitted

    monkeypatch.setattr(find, "_admits_another", spy)
    seen = _spied_searches(verdicts, judge)
    assert seen["another"] >= 50 and seen["admitted"] >= 50, seen


def test_fast_path_applies_on_a_plain_decode_batch() -> None:
    """A batch of decoding requests yields a run through their finishes, up to the last one."""
    config = EngineConfig(
        scheduler=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=512),
        cache=CacheConfig(num_gpu_blocks=100, block_size=4),
    )
    core = EngineCore(config)
    for i, max_tokens in enumerate((10, 20, 30)):
        core.add_request(
            Request(str(i), sampling_params=SamplingParams(max_tokens=max_tokens),
                    prompt_token_ids=[i + 1] * 5, block_hasher=TokenBlockHasher(4)),
            0.0,
        )
    _iterate(core, 0.0)  # prefill all three, first tokens sampled
    run = core.find_bulk_run(TOKEN)
    assert run is not None
    # request "0" has 1 output of 10: it finishes at the update of iteration 8, "1" at 18,
    # "2" at 28; synchronous iterations 0..28 each schedule at least one request
    assert run.finish_iteration == [8, 18, 28]
    assert run.max_iterations == 29 and run.num_reqs_at_start == 3
    assert run.ensure_shapes(29) == 29
    assert run.decoding[:10] == [3] * 9 + [2]
    assert run.context_sum[0] == 15 and run.context_sum[9] == 2 * 5 + 2 * 9
    assert run.finishing(8) == [0] and run.finishing(28) == [2]


def _engine(async_scheduling: bool, budget: int = 16) -> EngineCore:
    return EngineCore(EngineConfig(
        scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=8,
                                  max_model_len=512, async_scheduling=async_scheduling),
        cache=CacheConfig(num_gpu_blocks=200, block_size=4),
    ))


def _request(req_id: str, prompt_len: int, max_tokens: int) -> Request:
    return Request(req_id, sampling_params=SamplingParams(max_tokens=max_tokens),
                   prompt_token_ids=[7 + len(req_id)] * prompt_len,
                   block_hasher=TokenBlockHasher(4))


def _every_length_equals_step_by_step(build: Callable[[], EngineCore]) -> int:
    """Bulk-apply each possible number of iterations of the run found in ``build()``'s state,
    against as many steps of another ``build()``; returns the run's length. (Built twice, not
    copied: the compiled core's classes cannot be deep-copied, and these tests run compiled
    too.)"""
    run = build().find_bulk_run(TOKEN)
    assert run is not None
    for k in range(1, run.max_iterations + 1):
        steps, bulk = build(), build()
        bulk_run = bulk.find_bulk_run(TOKEN)
        assert bulk_run is not None
        bulk.apply_bulk_run(bulk_run, k, TOKEN, _timing(k, 10.0))
        for i in range(k):
            _iterate(steps, 10.0 + i)
        assert _state(bulk) == _state(steps), f"{k} iterations"
    return run.max_iterations


def _two_decodes(async_scheduling: bool, budget: int = 16) -> EngineCore:
    core = _engine(async_scheduling, budget)
    for i in range(2):
        core.add_request(_request(f"d{i}", 5, 30), 0.0)
    for step in range(3):
        _iterate(core, float(step))
    return core


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_long_prompt_is_prefilled_inside_a_run(async_scheduling: bool) -> None:
    """Two decodes and a 40-token prompt under a 16-token budget: the prompt takes what the
    decodes leave (14 tokens a step) until it is prefilled, then decodes too — one run."""

    def build() -> EngineCore:
        core = _two_decodes(async_scheduling)
        core.add_request(_request("long", 40, 6), 3.0)
        _iterate(core, 3.0)  # admits it with its first chunk, step by step
        return core

    run = build().find_bulk_run(TOKEN)
    assert run is not None and run.prefill_index == 2 and not run.admitted
    assert run.prefill_chunk == [14, 12]  # 40 = 14 (already scheduled) + 14 + 12
    assert run.prefill_done_iteration == 1
    assert run.decode_start[2] == 2  # it decodes from the iteration after its last chunk
    assert _every_length_equals_step_by_step(build) == run.max_iterations > 5


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_an_arrival_is_admitted_by_the_first_step_of_a_run(async_scheduling: bool) -> None:
    """A request arriving at running decodes is admitted by the run's first schedule() (by
    the scheduler's own admission code), then prefilled and decoded inside the same run."""

    def build() -> EngineCore:
        core = _two_decodes(async_scheduling)
        core.add_request(_request("new", 20, 6), 3.0)
        return core

    run = build().find_bulk_run(TOKEN)
    assert run is not None and run.admitted and run.prefill_index == 2
    assert run.admission_chunk == 14 and run.prefill_chunk == [14, 6]
    assert run.num_waiting == 0
    _every_length_equals_step_by_step(build)
    # recorded as the step-by-step path records it: scheduled once, by the first schedule()
    bulk = build()
    bulk_run = bulk.find_bulk_run(TOKEN)
    assert bulk_run is not None
    bulk.apply_bulk_run(bulk_run, 3, TOKEN, _timing(3, 10.0))
    events = [e for e in bulk.event_log.iter_events(expand_tokens=False) if e.req_id == "new"]
    assert [(e.kind.name, e.time_s, e.payload) for e in events if e.kind.name == "SCHEDULED"] == [
        ("SCHEDULED", 10.0, 0)
    ]
    steps = bulk.event_log.steps_columns()
    first = list(steps["step_id"]).index(bulk_run.first_step_id)
    assert steps["num_new_reqs"][first] == 1


def test_two_admissions_in_one_step_are_left_to_the_scheduler() -> None:
    """When the first schedule() would go on to try a second waiting request, no run is
    planned: the step-by-step scheduler decides that step."""
    core = _two_decodes(False, budget=64)
    core.add_request(_request("a", 8, 6), 2.0)
    assert core.find_bulk_run(TOKEN) is not None  # one arrival: absorbed
    core.add_request(_request("b", 8, 6), 2.0)
    assert core.find_bulk_run(TOKEN) is None  # budget and seats left for the second one


def test_an_admission_whose_hits_the_first_decodes_evict_is_left_to_the_scheduler() -> None:
    """The first schedule() allocates the decodes' blocks before it admits: popping a cached
    block the arrival would have hit shortens its hit. Such an admission is not planned."""
    core = EngineCore(EngineConfig(
        scheduler=SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=8, max_model_len=64),
        cache=CacheConfig(num_gpu_blocks=8, block_size=4),
    ))
    core.add_request(_request("d", 3, 40), 0.0)
    for rid, token in (("a", 1), ("c", 2)):  # 3 full blocks each, done after one token
        core.add_request(Request(rid, sampling_params=SamplingParams(max_tokens=1),
                                 prompt_token_ids=[token] * 12,
                                 block_hasher=TokenBlockHasher(4)), 0.0)
    for step in range(2):
        _iterate(core, float(step))
    core.add_request(Request("x", sampling_params=SamplingParams(max_tokens=4),
                             prompt_token_ids=[1] * 12 + [9], block_hasher=TokenBlockHasher(4)),
                     2.0)
    kv = core.scheduler.kv_cache_manager
    free = kv.block_pool.free_queue.get_all_free_blocks()
    assert len(free) == 6 and all(kv.block_pool.in_map[b] for b in free)  # "a"'s, then "c"'s
    assert core.scheduler.requests["d"].num_computed_tokens == 4  # it pops free[0] next
    assert kv.get_computed_blocks(core.scheduler.waiting.peek_request())[1] == 12
    run = core.find_bulk_run(TOKEN)
    assert run is None or not run.admitted
    _iterate(core, 2.0)
    scheduled = [e.payload for e in core.event_log.iter_events(expand_tokens=False)
                 if e.req_id == "x" and e.kind.name == "SCHEDULED"]
    assert scheduled == [8]  # "a"'s last block went to "d": two blocks hit, not three


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_prompt_of_max_model_len_stops_at_its_first_token(async_scheduling: bool) -> None:
    """A prompt of exactly max_model_len tokens is admitted (as vLLM admits it) and its first
    token ends it: inside a bulk run it finishes then, not an iteration early."""

    def build() -> EngineCore:
        core = EngineCore(EngineConfig(
            scheduler=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=32,
                                      async_scheduling=async_scheduling),
            cache=CacheConfig(num_gpu_blocks=40, block_size=4),
        ))
        core.add_request(_request("d", 3, 20), 0.0)
        for step in range(2):
            _iterate(core, float(step))
        core.add_request(_request("w", 32, 5), 2.0)
        return core

    run = build().find_bulk_run(TOKEN)
    assert run is not None and run.admitted
    assert run.finish_iteration[run.prefill_index] == (1 if async_scheduling else 0)
    _every_length_equals_step_by_step(build)


def _simulated_request(i: int, prompt_len: int, max_tokens: int) -> Request:
    """A request as the simulator makes it: prompt keys given, generated blocks private."""
    keys = [("p", i, j) for j in range(prompt_len // 4)]
    return Request(str(i), sampling_params=SamplingParams(max_tokens=max_tokens),
                   num_prompt_tokens=prompt_len,
                   block_hasher=PrecomputedBlockHasher(4, keys, unique_id=i))


def _blocked_head(async_scheduling: bool, token_hashed: bool = False) -> EngineCore:
    """Two decodes hold 8 of 19 usable blocks; a 52-token prompt (13 blocks: all of its
    sequence must fit) waits until the longer prompt's decode finishes and frees its 8."""
    core = EngineCore(EngineConfig(
        scheduler=SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=8, max_model_len=512,
                                  async_scheduling=async_scheduling),
        cache=CacheConfig(num_gpu_blocks=20, block_size=4),
    ))
    for i, prompt_len, max_tokens in ((0, 20, 10), (1, 5, 30)):
        core.add_request(_request(f"d{i}", prompt_len, max_tokens) if token_hashed
                         else _simulated_request(i, prompt_len, max_tokens), 0.0)
    for step in range(3):
        _iterate(core, float(step))
    core.add_request(_simulated_request(9, 52, 4), 3.0)
    return core


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_head_refused_for_kv_blocks_waits_inside_a_run(async_scheduling: bool) -> None:
    """The head of the queue cannot get its blocks while both decodes run: the run holds its
    refusals (recorded as the scheduler records them) and ends at the first schedule() after
    the shorter decode finishes, the one that admits it."""
    run = _blocked_head(async_scheduling).find_bulk_run(TOKEN)
    assert run is not None and not run.admitted and run.head_blocked_while == 2
    first_finish = run.finish_iters[0]
    assert run.max_iterations == first_finish + 1
    assert run.ensure_shapes(run.max_iterations) == run.max_iterations
    assert set(run.blockers) == {AdmissionBlocker.KV_CACHE}
    _every_length_equals_step_by_step(lambda: _blocked_head(async_scheduling))
    # after the run, the step-by-step path admits it
    core = _blocked_head(async_scheduling)
    bulk_run = core.find_bulk_run(TOKEN)
    assert bulk_run is not None
    core.apply_bulk_run(bulk_run, bulk_run.max_iterations, TOKEN,
                        _timing(bulk_run.max_iterations, 10.0))
    _iterate(core, 20.0)
    assert "9" in [r.req_id for r in core.scheduler.running]


def test_a_head_that_decodes_could_hit_is_left_to_the_scheduler() -> None:
    """Decodes hashed by their tokens register blocks another request could hit: the head's
    refusal might not last, so no run holds it."""
    core = _blocked_head(False, token_hashed=True)
    assert core.find_bulk_run(TOKEN) is None
