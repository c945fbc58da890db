"""Engine statistics computed without per-step strings equal pandas' string route."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from reports.columns import frame_columns
from reports.engine_stats import blocker_fractions

NAMES = ["", "budget", "kv_cache", "seats", "policy", "max_loras", "lora"] + [
    f"b{i}" for i in range(12)]  # more distinct values than numpy sorts by insertion


def _by_strings(blockers: pd.Series) -> list[tuple[str, float]]:
    """The reference: every step's blocker as a string, counted by pandas."""
    strings = blockers.astype(str).replace("", "none")
    return [(str(k), float(v)) for k, v in strings.value_counts(normalize=True).items()]


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.sampled_from(NAMES)), max_size=80),
       layout=st.sampled_from(["categorical", "reversed categories", "unused category",
                               "strings"]))
def test_blocker_fractions_equal_value_counts_of_the_strings(values: list[str | None],
                                                              layout: str) -> None:
    present = sorted({v for v in values if v is not None})
    if layout == "categorical":
        column = pd.Series(pd.Categorical([np.nan if v is None else v for v in values]))
    elif layout == "reversed categories":
        column = pd.Series(pd.Categorical(values, categories=present[::-1]))
    elif layout == "unused category":
        column = pd.Series(pd.Categorical(values, categories=[*present, "unused"]))
    else:
        column = pd.Series(values, dtype="str")
    # the same keys with the same values, in the same order (ties: first appearance)
    labels = frame_columns(pd.DataFrame({"admission_blocker": column})).labels(
        "admission_blocker")
    assert list(blocker_fractions(labels).items()) == _by_strings(column)
