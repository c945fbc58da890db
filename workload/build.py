"""``build_workload``: the request stream a ``WorkloadConfig`` describes (a pure function of it).

Datasets (names and flags mirror ``vllm bench serve``):

* ``random`` — lengths uniform in ``[len·(1−r), len·(1+r)]`` (``--random-input-len``,
  ``--random-output-len``, ``--random-range-ratio``), an optional prefix shared by every
  request (``--random-prefix-len``); drawn with ``numpy.random.default_rng(seed)`` as vllm bench
  does (``workload.lengths``).
* ``prefix_repetition`` — ``num_prefixes`` distinct prefixes, ``num_prompts // num_prefixes``
  requests each (prefix + unique suffix), shuffled with the seed.
* ``sharegpt`` — a ShareGPT-format JSON file of conversations (``workload.sharegpt``): the
  first turn is the prompt (its text is kept in ``extra["prompt_texts"]``, what a served run
  sends), token counts come from ``tokenizer``; arrivals are synthetic.
* ``trace`` — a file (``workload.traces``): a request-stream CSV ``arrived_at,
  num_prefill_tokens, num_decode_tokens`` (Vidur's format, seconds), an Azure LLM 2023 CSV
  ``TIMESTAMP, ContextTokens, GeneratedTokens``, or a Mooncake JSONL (``timestamp`` ms,
  ``input_length``, ``output_length``, ``hash_ids`` — one id per 512-token block, equal ids =
  shared prefix, used for prefix caching). The file's own arrival times are replayed
  (optionally sped up by ``trace_time_scale``) unless a ``request_rate`` is given, in which
  case the trace only supplies lengths (sampled with the seed) and arrivals are synthetic.

Synthetic arrivals are vllm bench's gamma process, or its ramp-up (``workload.arrivals``).

Tenants and SLO classes (``labels``): the trace's ``tenant`` / ``slo_class`` columns when it
has them, else drawn with the seed from ``tenant_mix`` / ``slo_class_mix``; a single SLO class
goes to every request. A column and a mix for the same label, or a trace naming a class that
``slo_classes`` does not define, is an error.
"""

from __future__ import annotations

import math

import numpy as np

from engine.core.slo import SLOClass
from workload.arrivals import ramp_up_send_times, synthetic_send_times
from workload.config import MAX_SPAN_S, WorkloadConfig
from workload.errors import WorkloadError
from workload.lengths import uniform_lengths
from workload.stream import Workload
from workload.traces import load_trace


def build_workload(cfg: WorkloadConfig) -> Workload:
    """The workload ``cfg`` describes (deterministic in ``cfg.seed``)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if cfg.dataset_name == "random":
            w = _random(cfg)
        elif cfg.dataset_name == "prefix_repetition":
            w = _prefix_repetition(cfg)
        elif cfg.dataset_name == "sharegpt":
            w = _sharegpt(cfg)
        else:
            w = _trace(cfg)
    send = w.send_time_s
    if len(send) and not (np.isfinite(send).all() and float(send.max()) <= MAX_SPAN_S):
        raise WorkloadError(
            f"the arrival times overflow or span more than {MAX_SPAN_S:g} s (last send at "
            f"{float(send[-1])} s): "
            f"request_rate ({cfg.request_rate}) or trace_time_scale ({cfg.trace_time_scale}) "
            "is too small"
        )
    if cfg.priority_mix:
        rng = np.random.default_rng(cfg.seed + 7919)
        prios = np.array([p for p, _ in cfg.priority_mix], dtype=np.int64)
        fracs = np.array([f for _, f in cfg.priority_mix], dtype=np.float64)
        w = _replace(w, priorities=prios[rng.choice(len(prios), size=len(w), p=fracs)])
    return labels(cfg, w)


#: Seed offsets of the label draws (independent of the lengths, arrivals and priorities).
TENANT_SEED_OFFSET = 104_729
SLO_CLASS_SEED_OFFSET = 1_299_709


def labels(cfg: WorkloadConfig, w: Workload) -> Workload:
    """``w`` with each request's tenant and SLO class drawn from the mixes, or the one class
    given to everyone (a trace's columns are read by ``_trace``)."""
    changes: dict[str, object] = {}
    if cfg.tenant_mix:
        if w.tenant_ids is not None:
            raise WorkloadError(
                "the trace gives each request a tenant (its tenant column) and tenant_mix "
                "draws them too: leave one out"
            )
        names, ids = _draw(cfg.tenant_mix, len(w), cfg.seed + TENANT_SEED_OFFSET)
        changes.update(tenants=names, tenant_ids=ids)
    classes = cfg.slo_class_defs()
    if cfg.slo_class_mix:
        if w.slo_class_ids is not None:
            raise WorkloadError(
                "the trace gives each request an SLO class (its slo_class column) and "
                "slo_class_mix draws them too: leave one out"
            )
        names, ids = _draw(cfg.slo_class_mix, len(w), cfg.seed + SLO_CLASS_SEED_OFFSET)
        changes.update(slo_classes=classes, slo_class_ids=_class_ids(classes, names, ids))
    elif w.slo_class_ids is None and len(classes) == 1:
        changes.update(slo_classes=classes, slo_class_ids=np.zeros(len(w), dtype=np.int32))
    elif w.slo_class_ids is None and classes:
        raise WorkloadError(
            f"slo_classes defines {len(classes)} classes but nothing says which request has "
            "which: give slo_class_mix, or a trace with an slo_class column"
        )
    return _replace(w, **changes) if changes else w


def _codes(values: list[str]) -> tuple[tuple[str, ...], np.ndarray]:
    """Distinct names in first-seen order, and each value's index among them."""
    names: dict[str, int] = {}
    ids = np.fromiter((names.setdefault(v, len(names)) for v in values), np.int32, len(values))
    return tuple(names), ids


def _draw(
    mix: tuple[tuple[str, float], ...], n: int, seed: int
) -> tuple[tuple[str, ...], np.ndarray]:
    """``n`` names drawn from ``mix`` ((name, fraction), …): the names, and each draw's index."""
    rng = np.random.default_rng(seed)
    fracs = np.array([f for _, f in mix], dtype=np.float64)
    return tuple(name for name, _ in mix), rng.choice(len(mix), size=n, p=fracs).astype(np.int32)


def _class_ids(
    classes: tuple[SLOClass, ...], names: tuple[str, ...], ids: np.ndarray
) -> np.ndarray:
    """Indexes into ``classes`` of the requests whose class is ``names[ids[i]]``; a name
    ``classes`` does not define is an error."""
    defined = [c.name for c in classes]
    undefined = [n for n in names if n not in defined]
    if undefined:
        raise WorkloadError(
            f"the trace names SLO class(es) {', '.join(map(repr, undefined))} that slo_classes "
            f"does not define (defined: {', '.join(defined) or 'none'}): define each as "
            "[name, ttft_ms, tpot_ms]"
        )
    index = np.array([defined.index(n) for n in names], dtype=np.int32)
    out: np.ndarray = index[ids]
    return out


def send_times(cfg: WorkloadConfig, n: int) -> np.ndarray:
    """Synthetic send times of ``n`` requests: the gamma process at ``request_rate``, or the
    ramp-up when one is configured."""
    if cfg.ramp_up_strategy is not None:
        assert cfg.ramp_up_start_rps is not None and cfg.ramp_up_end_rps is not None
        return ramp_up_send_times(n, cfg.ramp_up_strategy, cfg.ramp_up_start_rps,
                                  cfg.ramp_up_end_rps, cfg.burstiness, cfg.seed)
    return synthetic_send_times(n, cfg.request_rate, cfg.burstiness, cfg.seed)


def _replace(w: Workload, **changes: object) -> Workload:
    fields_ = {name: getattr(w, name) for name in Workload.__dataclass_fields__}
    fields_.update(changes)
    return Workload(**fields_)


def _random(cfg: WorkloadConfig) -> Workload:
    n = cfg.num_prompts
    rng = np.random.default_rng(cfg.seed)
    input_lens = uniform_lengths(rng, n, cfg.random_input_len, cfg.random_range_ratio)
    output_lens = uniform_lengths(rng, n, cfg.random_output_len, cfg.random_range_ratio)
    prefix = cfg.random_prefix_len
    return Workload(
        send_time_s=send_times(cfg, n),
        prompt_lens=input_lens + prefix,
        output_lens=output_lens,
        priorities=np.zeros(n, dtype=np.int64),
        shared_prefix_ids=np.full(n, 0 if prefix else -1, dtype=np.int64),
        shared_prefix_lens=np.full(n, prefix, dtype=np.int64),
        max_concurrency=cfg.max_concurrency,
        source=(
            f"random: input {cfg.random_input_len}, output {cfg.random_output_len}, range ratio "
            f"{cfg.random_range_ratio}, shared prefix {prefix}"
        ),
        request_rate=cfg.request_rate,
        burstiness=cfg.burstiness,
    )


def _prefix_repetition(cfg: WorkloadConfig) -> Workload:
    per_prefix = cfg.num_prompts // cfg.prefix_repetition_num_prefixes
    n = per_prefix * cfg.prefix_repetition_num_prefixes
    ids = np.repeat(np.arange(cfg.prefix_repetition_num_prefixes, dtype=np.int64), per_prefix)
    np.random.default_rng(cfg.seed).shuffle(ids)
    prompt = cfg.prefix_repetition_prefix_len + cfg.prefix_repetition_suffix_len
    return Workload(
        send_time_s=send_times(cfg, n),
        prompt_lens=np.full(n, prompt, dtype=np.int64),
        output_lens=np.full(n, cfg.prefix_repetition_output_len, dtype=np.int64),
        priorities=np.zeros(n, dtype=np.int64),
        shared_prefix_ids=ids,
        shared_prefix_lens=np.full(n, cfg.prefix_repetition_prefix_len, dtype=np.int64),
        max_concurrency=cfg.max_concurrency,
        source=(
            f"prefix_repetition: {cfg.prefix_repetition_num_prefixes} prefixes of "
            f"{cfg.prefix_repetition_prefix_len} tokens, suffix "
            f"{cfg.prefix_repetition_suffix_len}, output {cfg.prefix_repetition_output_len}"
        ),
        request_rate=cfg.request_rate,
        burstiness=cfg.burstiness,
    )


def _trace(cfg: WorkloadConfig) -> Workload:
    assert cfg.dataset_path is not None
    rows = load_trace(cfg.dataset_path)
    total = len(rows.prompt_lens)
    n = cfg.num_prompts
    if cfg.trace_rate_given or cfg.ramp_up_strategy is not None:
        rng = np.random.default_rng(cfg.seed)
        idx = rng.choice(total, size=n, replace=n > total)
        send = send_times(cfg, n)
        timing = (f"synthetic arrivals at {cfg.request_rate} req/s"
                  if cfg.ramp_up_strategy is None else f"a {cfg.ramp_up_strategy} ramp-up")
    else:
        n = min(n, total)
        idx = np.arange(n)
        send = (rows.arrival_s[:n] - rows.arrival_s[0]) / cfg.trace_time_scale
        timing = "the trace's own arrival times" + (
            f" sped up {cfg.trace_time_scale}x" if cfg.trace_time_scale != 1 else ""
        )
    hash_ids = [rows.hash_ids[i] for i in idx] if rows.hash_ids is not None else None
    label_columns: dict[str, object] = {}
    if rows.tenants is not None:
        names, ids = _codes([rows.tenants[i] for i in idx])
        label_columns.update(tenants=names, tenant_ids=ids)
    if rows.slo_classes is not None:
        classes = cfg.slo_class_defs()
        names, ids = _codes([rows.slo_classes[i] for i in idx])
        label_columns.update(slo_classes=classes, slo_class_ids=_class_ids(classes, names, ids))
    return Workload(
        send_time_s=send,
        prompt_lens=rows.prompt_lens[idx],
        output_lens=rows.output_lens[idx],
        priorities=np.zeros(len(idx), dtype=np.int64),
        shared_prefix_ids=np.full(len(idx), -1, dtype=np.int64),
        shared_prefix_lens=np.zeros(len(idx), dtype=np.int64),
        max_concurrency=cfg.max_concurrency,
        source=f"{rows.kind} trace {cfg.dataset_path} ({len(idx)} of {total} requests, {timing})",
        hash_ids=hash_ids,
        request_rate=cfg.request_rate if cfg.trace_rate_given else math.nan,
        burstiness=cfg.burstiness,
        **label_columns,  # type: ignore[arg-type]
    )


def _sharegpt(cfg: WorkloadConfig) -> Workload:
    from workload.sharegpt import load_sharegpt

    assert cfg.dataset_path is not None and cfg.tokenizer is not None
    rows = load_sharegpt(cfg.dataset_path, cfg.tokenizer, cfg.num_prompts, cfg.seed,
                         cfg.sharegpt_output_len)
    n = len(rows.prompts)
    return Workload(
        send_time_s=send_times(cfg, n),
        prompt_lens=rows.prompt_lens,
        output_lens=rows.output_lens,
        priorities=np.zeros(n, dtype=np.int64),
        shared_prefix_ids=np.full(n, -1, dtype=np.int64),
        shared_prefix_lens=np.zeros(n, dtype=np.int64),
        max_concurrency=cfg.max_concurrency,
        source=f"sharegpt: {cfg.dataset_path} ({n} conversations, tokens of {cfg.tokenizer})",
        request_rate=cfg.request_rate,
        burstiness=cfg.burstiness,
        extra={"prompt_texts": rows.prompts},
    )
