"""``twinserve simulate --explain-step SPEC``: one step's cost by term, for a batch the user names.

SPEC lists the step's parts, comma-separated:

* ``decode:NxC`` — N decodes, each with C tokens already cached (``decode:64x2048``);
* ``prefill:Q`` — one prefill chunk of Q new tokens on an empty cache (``prefill:4096``);
* ``prefill:Q@C`` — a chunk of Q tokens after C cached ones (chunked prefill, prefix hit);
* ``prefill:KxQ`` / ``prefill:KxQ@C`` — K such chunks.

Every decode and every prefill chunk samples a token (each chunk is taken to finish its
prompt). Example: ``--explain-step prefill:512@3584,decode:63x1024`` is a chunked-prefill step
of vLLM's default scheduler.
"""

from __future__ import annotations

from engine.core.errors import UserError
from engine.core.interfaces import CostModel
from engine.core.outputs import BatchShape


class ExplainStepError(UserError):
    """A ``--explain-step`` spec that cannot be parsed."""


def _int(text: str, what: str, spec: str) -> int:
    if not text.isdigit() or int(text) < 0:
        raise ExplainStepError(f"--explain-step {spec!r}: {what} must be a whole number, "
                               f"got {text!r}")
    return int(text)


def parse_step(spec: str) -> BatchShape:
    """The ``BatchShape`` a ``--explain-step`` spec describes (module docstring)."""
    decodes: list[int] = []
    chunks: list[tuple[int, int]] = []
    for part in (p.strip() for p in spec.split(",")):
        kind, sep, body = part.partition(":")
        if not sep or kind not in ("decode", "prefill"):
            raise ExplainStepError(
                f"--explain-step {spec!r}: each part is decode:NxC or prefill:[Kx]Q[@C], "
                f"got {part!r}"
            )
        if kind == "decode":
            count, x, ctx = body.partition("x")
            if not x:
                raise ExplainStepError(f"--explain-step {spec!r}: decode needs NxC "
                                       f"(requests x cached tokens), got {part!r}")
            n = _int(count, "the number of decodes", spec)
            decodes += [_int(ctx, "the decode context", spec)] * n
        else:
            head, at, ctx = body.partition("@")
            count, x, q = head.partition("x")
            k = _int(count, "the number of chunks", spec) if x else 1
            q_len = _int(q if x else count, "the chunk length", spec)
            if q_len < 2:
                raise ExplainStepError(f"--explain-step {spec!r}: a prefill chunk has at least "
                                       "2 tokens (one token is a decode)")
            c = _int(ctx, "the cached context", spec) if at else 0
            chunks += [(q_len, c)] * k
    if not decodes and not chunks:
        raise ExplainStepError(f"--explain-step {spec!r} names no tokens")
    num_reqs = len(decodes) + len(chunks)
    return BatchShape(
        num_reqs=num_reqs,
        num_tokens=len(decodes) + sum(q for q, _ in chunks),
        prefill_query_lens=tuple(q for q, _ in chunks),
        prefill_context_lens=tuple(c for _, c in chunks),
        num_decode_reqs=len(decodes),
        decode_context_sum=sum(decodes),
        decode_context_max=max(decodes, default=0),
        num_sampling_reqs=num_reqs,
    )


def format_explanation(cost_model: CostModel, shape: BatchShape, title: str) -> str:
    """The step's cost by term as a plain-text table (any cost model; the vLLM step model
    adds its graph mode, padding and each term's source)."""
    lines = [title]
    decodes, chunks = shape.num_decode_reqs, shape.num_prefill_reqs
    mean = shape.decode_context_sum / decodes if decodes else 0.0
    lines.append(
        f"batch: {decodes} decodes (mean context {mean:.0f}), {chunks} prefill chunks "
        f"({shape.num_prefill_tokens} tokens) -> {shape.num_tokens} tokens"
    )
    explain = getattr(cost_model, "explain", None)
    if explain is not None:
        from sim.cost.vllm_step import StepExplanation

        ex: StepExplanation = explain(shape)
        pad = ex.padded_tokens - ex.num_tokens
        how = {"full": "FULL CUDA graph", "piecewise": "PIECEWISE CUDA graphs",
               "eager": "eager (no CUDA graph)"}[ex.mode]
        size = f" at captured size {ex.padded_tokens} (+{pad} padded rows)" if (
            ex.mode != "eager") else ""
        lines.append(f"vLLM 0.33 plan: {how}{size}")
        lines.append(f"{'term':<20} {'µs/step':>10} {'share':>7}  detail")
        for t in ex.terms:
            if t.seconds == 0.0:
                continue
            share = t.seconds / ex.total_s if ex.total_s else 0.0
            lines.append(f"{t.name:<20} {t.seconds * 1e6:>10,.1f} {share:>7.1%}  {t.detail}")
        lines.append(f"{'device total':<20} {ex.total_s * 1e6:>10,.1f}")
        lines.append(
            f"host: {ex.host_s * 1e6:,.1f} µs input preparation before the first kernel, "
            f"{ex.launch_s * 1e6:,.1f} µs launching (overlaps the device; with async scheduling "
            "both overlap the previous step)"
        )
        return "\n".join(lines)
    st = cost_model.step_time(shape)
    lines.append(f"{'term':<20} {'µs/step':>10}")
    for name, value in (("linear", st.linear_s), ("attention", st.attention_s),
                        ("communication", st.communication_s), ("overhead", st.overhead_s)):
        lines.append(f"{name:<20} {value * 1e6:>10,.1f}")
    lines.append(f"{'device total':<20} {st.total_s * 1e6:>10,.1f}")
    stage_times = getattr(cost_model, "stage_times", None)
    if stage_times is not None:  # a pipeline: each stage and each send of this micro-batch
        pipe = stage_times(shape)
        for s, seconds in enumerate(pipe.stage_s):
            lines.append(f"{f'stage {s}':<20} {seconds * 1e6:>10,.1f}")
        for s, seconds in enumerate(pipe.send_s):
            lines.append(f"{f'send {s} -> {s + 1}':<20} {seconds * 1e6:>10,.1f}")
    return "\n".join(lines)
