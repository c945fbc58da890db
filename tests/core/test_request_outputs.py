"""A request's output tokens: counted while they repeat one token, listed from the first that
differs (engine/core/request.py), and read back the same either way."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given

from engine.core.request import Request, RequestStatus, SamplingParams

# (kind, token, count): 0 = append_output_token_id, 1 = append_output_tokens, 2 =
# append_sampled_token, 3 = read output_token_ids in the middle
_OPS = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from([0, 0, 0, 7, 9]), st.integers(0, 5)),
    max_size=40,
)


def _request(with_ids: bool) -> Request:
    params = SamplingParams(max_tokens=10_000, ignore_eos=True)
    if with_ids:
        return Request("r", sampling_params=params, prompt_token_ids=[1, 2, 3])
    return Request("r", sampling_params=params, num_prompt_tokens=3)


@given(ops=_OPS, with_ids=st.booleans())
def test_outputs_read_as_the_list_of_every_token_appended(
    ops: list[tuple[int, int, int]], with_ids: bool
) -> None:
    req = _request(with_ids)
    expected: list[int] = []
    for kind, token, count in ops:
        if kind == 0:
            req.append_output_token_id(token)
            expected.append(token)
        elif kind == 1:
            req.append_output_tokens(token, count)
            expected.extend([token] * count)
        elif kind == 2:
            assert not req.append_sampled_token(token, max_model_len=100_000)
            expected.append(token)
        else:
            assert req.output_token_ids == expected
        assert req.num_output_tokens == len(expected)
        assert req.num_tokens == 3 + len(expected)
    assert req.output_token_ids == expected
    if with_ids:
        assert req.all_token_ids == [1, 2, 3, *expected]


def test_repeated_placeholders_are_counted_not_stored() -> None:
    req = _request(with_ids=False)
    for _ in range(100):
        req.append_output_tokens(0, 50)
    assert req.num_output_tokens == 5_000
    assert req._output_token_ids is None  # the point: no 5,000-entry list
    assert req.output_token_ids == [0] * 5_000  # made when read, then kept and extended
    req.append_output_token_id(0)
    assert req.output_token_ids == [0] * 5_001


def test_the_length_limit_counts_repeated_outputs() -> None:
    req = Request("r", sampling_params=SamplingParams(max_tokens=3, ignore_eos=True),
                  num_prompt_tokens=4)
    req.append_output_tokens(0, 2)
    assert req.append_sampled_token(0, max_model_len=100)
    assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert req.output_token_ids == [0, 0, 0]
