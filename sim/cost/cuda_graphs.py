"""vLLM 0.33's CUDA-graph capture sizes and how a batch is dispatched onto them.

With the default ``cudagraph_mode`` FULL_AND_PIECEWISE (``-O2``), vLLM captures graphs at a
list of token counts (``capture_sizes``) and runs each step at the smallest captured size that
holds its tokens (the padded rows compute garbage that is thrown away):

* a uniform decode batch (every request computes one token) whose padded size is at most
  ``max_num_seqs`` replays one FULL graph of the whole forward pass — attention included;
* any other batch up to the largest captured size replays PIECEWISE graphs: the layers' dense
  parts run as captured pieces, attention and the KV-cache update eagerly between them on the
  real (unpadded) rows;
* larger batches, and every batch under ``--enforce-eager``, run without graphs at their real
  size (EAGER), every kernel launched from the host.

Sources (vLLM 0.33.0): ``vllm/config/vllm.py`` ``_set_cudagraph_sizes``,
``vllm/v1/cudagraph_dispatcher.py`` ``dispatch``. Flags keep vLLM's names:
``--max-cudagraph-capture-size``, ``--cudagraph-capture-sizes``, ``--enforce-eager``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from engine.core.config import ConfigError

#: Execution modes of a step (ints: compared in the per-step path).
EAGER: Final = 0
PIECEWISE: Final = 1
FULL: Final = 2
MODE_NAMES: Final = ("eager", "piecewise", "full")

#: vLLM's default ceiling of the captured sizes: 1024 on data-centre Blackwell (compute
#: capability family 10.x), 512 elsewhere.
DEFAULT_MAX_CAPTURE = 512
BLACKWELL_MAX_CAPTURE = 1024


def capture_sizes(
    max_num_seqs: int,
    max_num_batched_tokens: int,
    *,
    sm_version: int = 90,
    enforce_eager: bool = False,
    max_cudagraph_capture_size: int | None = None,
    cudagraph_capture_sizes: Sequence[int] | None = None,
) -> tuple[int, ...]:
    """The token counts vLLM 0.33 captures graphs at (empty: no graphs), as
    ``VllmConfig._set_cudagraph_sizes`` computes them for a one-token-per-request decode."""
    if enforce_eager:
        return ()
    if cudagraph_capture_sizes is not None:
        if not cudagraph_capture_sizes or any(s < 1 for s in cudagraph_capture_sizes):
            raise ConfigError(
                f"cudagraph_capture_sizes must be positive token counts, got "
                f"{list(cudagraph_capture_sizes)}"
            )
        sizes = sorted({s for s in cudagraph_capture_sizes if s <= max_num_batched_tokens})
        if max_cudagraph_capture_size is not None and sizes and (
            max_cudagraph_capture_size != sizes[-1]
        ):
            raise ConfigError(
                f"max_cudagraph_capture_size {max_cudagraph_capture_size} must equal the "
                f"largest of cudagraph_capture_sizes ({sizes[-1]}), as vLLM requires"
            )
        return tuple(sizes)
    uniform_decode: list[int] = []
    if max_cudagraph_capture_size is None:
        ceiling = BLACKWELL_MAX_CAPTURE if sm_version // 10 == 10 else DEFAULT_MAX_CAPTURE
        largest = min(max_num_seqs * 2, ceiling)
        if max_num_seqs <= largest:
            uniform_decode = [max_num_seqs]
    else:
        if max_cudagraph_capture_size < 1:
            raise ConfigError(
                f"max_cudagraph_capture_size must be >= 1, got {max_cudagraph_capture_size}"
            )
        largest = max_cudagraph_capture_size
    largest = min(largest, max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= largest]
    if largest >= 8:
        sizes += range(8, min(largest + 1, 256), 8)
    if largest >= 256:
        sizes += range(256, largest + 1, 16)
    if max_num_batched_tokens <= largest:
        sizes.append(max_num_batched_tokens)
    sizes += [s for s in uniform_decode if s <= max_num_batched_tokens]
    return tuple(sorted(set(sizes)))


@dataclass(frozen=True, slots=True)
class CudaGraphConfig:
    """The user's CUDA-graph flags (vLLM's names; None = vLLM's default): the ``[cuda_graphs]``
    section of a simulation config. They change step costs, never scheduling decisions."""

    enforce_eager: bool = False  # no CUDA graphs (every kernel launched from the host)
    max_cudagraph_capture_size: int | None = None  # None: vLLM's default (512; 1024 Blackwell)
    cudagraph_capture_sizes: tuple[int, ...] | None = None  # None: vLLM's default list

    def __post_init__(self) -> None:
        top = self.max_cudagraph_capture_size
        if top is not None and (not isinstance(top, int) or isinstance(top, bool) or top < 1):
            raise ConfigError(f"max_cudagraph_capture_size must be a positive integer, got {top!r}")
        sizes = self.cudagraph_capture_sizes
        if sizes is None:
            return
        if not sizes or any(
            not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in sizes
        ):
            raise ConfigError(
                "cudagraph_capture_sizes must be a non-empty list of positive integers, "
                f"got {sizes!r}"
            )
        object.__setattr__(self, "cudagraph_capture_sizes", tuple(sizes))
        if top is not None and top != max(sizes):
            raise ConfigError(
                f"max_cudagraph_capture_size {top} must equal the largest of "
                f"cudagraph_capture_sizes ({max(sizes)}), as vLLM requires"
            )


class CudaGraphPlan:
    """Dispatch of a step onto vLLM's captured graphs: ``(mode, padded tokens)``."""

    sizes: tuple[int, ...]
    max_size: int
    max_num_seqs: int
    _pad: list[int]

    def __init__(self, sizes: Sequence[int], max_num_seqs: int) -> None:
        self.sizes = tuple(sorted(set(sizes)))
        self.max_size = self.sizes[-1] if self.sizes else 0
        self.max_num_seqs = max_num_seqs
        pad = [0] * (self.max_size + 1)
        j = 0
        for t in range(1, self.max_size + 1):
            while self.sizes[j] < t:
                j += 1
            pad[t] = self.sizes[j]
        self._pad = pad

    @classmethod
    def for_engine(
        cls, graphs: CudaGraphConfig, max_num_seqs: int, max_num_batched_tokens: int,
        sm_version: int,
    ) -> CudaGraphPlan:
        sizes = capture_sizes(
            max_num_seqs, max_num_batched_tokens, sm_version=sm_version,
            enforce_eager=graphs.enforce_eager,
            max_cudagraph_capture_size=graphs.max_cudagraph_capture_size,
            cudagraph_capture_sizes=graphs.cudagraph_capture_sizes,
        )
        return cls(sizes, max_num_seqs)

    def dispatch(self, num_tokens: int, uniform_decode: bool) -> tuple[int, int]:
        """(mode, tokens the GPU runs) of a step of ``num_tokens`` scheduled tokens;
        ``uniform_decode``: every scheduled request computes exactly one token."""
        if num_tokens > self.max_size or num_tokens <= 0:
            return EAGER, num_tokens
        padded = self._pad[num_tokens]
        if uniform_decode and padded <= self.max_num_seqs:
            return FULL, padded
        return PIECEWISE, padded
