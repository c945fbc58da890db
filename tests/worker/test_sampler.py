"""The sampler on fixed logits: greedy, temperature, top-k, top-p, min_tokens bans, seeds."""

from __future__ import annotations

import math

import pytest
import torch

from engine.worker.sampler import RowSampling, Sampler, apply_top_k_top_p

CPU = torch.device("cpu")
LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def rows(n: int, **kw: object) -> list[RowSampling]:
    params: dict[str, object] = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "generator": None}
    params.update(kw)
    return [RowSampling(**params) for _ in range(n)]  # type: ignore[arg-type]


def draw(n: int, **kw: object) -> torch.Tensor:
    """``n`` independent samples from ``LOGITS`` (one row each) with the engine generator."""
    return Sampler(CPU, seed=0)(LOGITS.repeat(n, 1), rows(n, **kw))


def frequencies(tokens: torch.Tensor) -> torch.Tensor:
    return torch.bincount(tokens, minlength=LOGITS.numel()).float() / tokens.numel()


def test_greedy_is_argmax_first_index_on_ties() -> None:
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, -1.0, 5.0, 0.0]])
    tokens = Sampler(CPU, seed=0)(logits, rows(2, temperature=0.0))
    assert tokens.tolist() == [1, 0]


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_samples_softmax_of_scaled_logits(temperature: float) -> None:
    n = 40_000
    expected = torch.softmax(LOGITS / temperature, dim=0)
    observed = frequencies(draw(n, temperature=temperature))
    # 5 standard errors of a binomial proportion.
    tolerance = 5 * torch.sqrt(expected * (1 - expected) / n) + 1e-9
    assert ((observed - expected).abs() <= tolerance).all(), (observed, expected)


def test_top_k_keeps_only_the_k_largest() -> None:
    observed = frequencies(draw(20_000, top_k=2))
    assert observed[2:].sum() == 0
    expected = torch.softmax(LOGITS[:2], dim=0)
    assert torch.allclose(observed[:2], expected, atol=0.02)


def test_top_p_keeps_the_smallest_nucleus() -> None:
    probs = torch.softmax(LOGITS, dim=0)  # ≈ [0.57, 0.21, 0.13, 0.08, 0.03, 0.004]
    assert probs[0] < 0.7 < probs[:2].sum()
    observed = frequencies(draw(20_000, top_p=0.7))
    assert observed[2:].sum() == 0
    assert torch.allclose(observed[:2], probs[:2] / probs[:2].sum(), atol=0.02)


def test_top_p_always_keeps_the_top_token() -> None:
    assert (draw(2_000, top_p=0.01) == 0).all()


def test_top_k_top_p_masking_exact() -> None:
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0], [1.0, 4.0, 3.0, 2.0]])
    masked = apply_top_k_top_p(logits.clone(), torch.tensor([2, 4]), torch.tensor([1.0, 0.5]))
    inf = -math.inf
    assert masked.tolist() == [[inf, 4.0, 3.0, inf], [inf, 4.0, inf, inf]]


def test_banned_tokens_are_never_sampled() -> None:
    tokens = draw(5_000, banned_token_ids=(0, 1))
    assert not ((tokens == 0) | (tokens == 1)).any()
    greedy = Sampler(CPU, 0)(LOGITS.repeat(1, 1), rows(1, temperature=0.0, banned_token_ids=(0,)))
    assert greedy.tolist() == [1]


def _seeded(seed: int) -> RowSampling:
    return RowSampling(1.0, 0, 1.0, torch.Generator().manual_seed(seed))


def _draws(seed: int, num_steps: int, batch_noise: bool) -> list[int]:
    """Tokens of one seeded request over ``num_steps`` steps, alone or among other rows."""
    logits = torch.zeros(1, 1000)  # uniform: every draw is pure generator output
    row = _seeded(seed)
    sampler = Sampler(CPU, seed=123)
    tokens = []
    for step in range(num_steps):
        batch = [*rows(step), row, _seeded(step)] if batch_noise else [row]
        index = step if batch_noise else 0
        tokens.append(int(sampler(logits.repeat(len(batch), 1), batch)[index]))
    return tokens


def test_seeded_rows_do_not_depend_on_the_batch() -> None:
    alone = _draws(42, 5, batch_noise=False)
    assert _draws(42, 5, batch_noise=True) == alone
    assert len(set(alone)) > 1  # the request's generator advances between steps
    assert _draws(43, 5, batch_noise=False) != alone


def test_engine_seed_makes_unseeded_sampling_reproducible() -> None:
    a = draw(100)
    b = draw(100)
    assert torch.equal(a, b)
    c = Sampler(CPU, seed=1)(LOGITS.repeat(100, 1), rows(100))
    assert not torch.equal(a, c)


def test_greedy_and_random_rows_mix() -> None:
    batch = [*rows(1, temperature=0.0), *rows(1, top_k=1), *rows(1, temperature=1.0)]
    logits = LOGITS.repeat(3, 1)
    logits[2] = torch.tensor([-50.0, -50.0, -50.0, -50.0, 50.0, -50.0])
    assert Sampler(CPU, 0)(logits, batch).tolist() == [0, 0, 4]
