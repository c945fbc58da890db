"""Output-length predictors for the length-aware policies (``sjf``, ``srpt``).

A predictor says how many output tokens a request will produce in all, before it has produced
them. Three are shipped, chosen by the policy option ``predictor``:

* ``oracle`` — the known length: ``max_tokens``. Workload requests (simulated and measured runs)
  stop exactly there (``ignore_eos``), so this is the true length; for a served request it is
  the client's cap, an upper bound.
* ``bucket`` — a length-bucket predictor fitted on a trace: prompt lengths are cut into
  ``num_buckets`` quantile buckets, and a request is predicted the median output length of its
  bucket. Fitted on the run's own request stream by default, or on the trace named by the
  option ``fit_on`` (a shipped trace name or a file); the proxy-model idea of Qiu et al.,
  "Efficient Interactive LLM Serving with Proxy Model-based Sequence Length Prediction"
  (AIOps '24, arXiv:2404.08509), with the prompt length as the only feature.
* ``noisy`` — the oracle times a log-normal error ``exp(noise_sigma · z)``, ``z`` standard
  normal, drawn per request from the run's seed and the request id (deterministic: a request
  gets the same prediction in every run of the seed, in either world).
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Mapping
from typing import Protocol

import numpy as np

from engine.core.policy import PolicyContext, PolicyError, RequestLengths, Scalar
from engine.core.request import Request

#: The options the length-aware policies take, with their defaults.
PREDICTOR_OPTIONS: dict[str, Scalar] = {
    "predictor": "oracle",  # oracle, bucket or noisy
    "num_buckets": 8,  # bucket: quantile buckets of prompt length
    "fit_on": "",  # bucket: a trace to fit on ("" = the run's own request stream)
    "noise_sigma": 0.5,  # noisy: standard deviation of the log-normal error
}


#: The predictor each option belongs to (given with another, it would do nothing).
_OPTION_OWNER: dict[str, str] = {"num_buckets": "bucket", "fit_on": "bucket",
                                 "noise_sigma": "noisy"}


class OutputLengthPredictor(Protocol):
    """Predicts a request's total output tokens (> 0) before it runs."""

    def predict(self, request: Request) -> float: ...


class OraclePredictor:
    """The known output length (``max_tokens``)."""

    def predict(self, request: Request) -> float:
        return float(request.max_tokens)


class NoisyOraclePredictor:
    """The known length times ``exp(sigma · z)``, ``z`` drawn from (seed, req_id)."""

    def __init__(self, sigma: float, seed: int) -> None:
        if not sigma >= 0:
            raise PolicyError(f"noise_sigma must be >= 0, got {sigma}")
        self.sigma = sigma
        self.seed = seed
        self._cache: dict[str, float] = {}

    def predict(self, request: Request) -> float:
        factor = self._cache.get(request.req_id)
        if factor is None:
            z = random.Random(f"{self.seed}/{request.req_id}").gauss(0.0, 1.0)
            factor = self._cache[request.req_id] = math.exp(self.sigma * z)
        return request.max_tokens * factor


class BucketPredictor:
    """The median output length of the request's prompt-length bucket (quantile buckets)."""

    def __init__(self, lengths: RequestLengths, num_buckets: int) -> None:
        n = len(lengths.prompt_lens)
        if n == 0 or n != len(lengths.output_lens):
            raise PolicyError("the bucket predictor needs (prompt, output) lengths to fit on")
        if num_buckets < 1:
            raise PolicyError(f"num_buckets must be >= 1, got {num_buckets}")
        prompts = np.asarray(lengths.prompt_lens, dtype=np.int64)
        outputs = np.asarray(lengths.output_lens, dtype=np.int64)
        order = np.lexsort((outputs, prompts))
        prompts, outputs = prompts[order], outputs[order]
        size = math.ceil(n / num_buckets)
        starts = range(0, n, size)
        #: upper prompt-length edge of each bucket but the last, and each bucket's prediction
        self.edges: list[int] = [int(prompts[min(s + size, n) - 1]) for s in starts][:-1]
        self.medians: list[float] = [float(np.median(outputs[s:s + size])) for s in starts]

    def predict(self, request: Request) -> float:
        return self.medians[bisect.bisect_left(self.edges, request.num_prompt_tokens)]


def make_predictor(options: Mapping[str, Scalar], context: PolicyContext) -> OutputLengthPredictor:
    """The predictor ``options`` (``PREDICTOR_OPTIONS``, already read) choose."""
    kind = options["predictor"]
    unused = [
        key for key, owner in _OPTION_OWNER.items()
        if options[key] != PREDICTOR_OPTIONS[key] and kind != owner
    ]
    if unused and kind in ("oracle", "bucket", "noisy"):
        raise PolicyError(
            f"option(s) {', '.join(unused)} do nothing with predictor {kind!r} (num_buckets and "
            "fit_on are the bucket predictor's, noise_sigma the noisy one's)"
        )
    if kind == "oracle":
        return OraclePredictor()
    if kind == "noisy":
        return NoisyOraclePredictor(float(options["noise_sigma"]), context.seed)
    if kind == "bucket":
        fit_on = str(options["fit_on"])
        lengths = _trace_lengths(fit_on) if fit_on else context.lengths
        if lengths is None:
            raise PolicyError(
                "predictor 'bucket' has no request stream to fit on here (a served stream is "
                "not known in advance): give the option fit_on=TRACE (a trace name or file)"
            )
        return BucketPredictor(lengths, int(options["num_buckets"]))
    raise PolicyError(f"unknown predictor {kind!r}; valid: oracle, bucket, noisy")


def _trace_lengths(path_or_name: str) -> RequestLengths:
    from workload.traces import load_trace  # (reads a file: only when asked to)

    rows = load_trace(path_or_name)
    return RequestLengths(rows.prompt_lens, rows.output_lens)
