"""`packing.groups.dense_groups` groups rows as `np.unique` does (first rows, each row's group, in id order)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from packing.groups import dense_groups


@given(st.integers(1, 60).flatmap(lambda bound: st.tuples(st.just(bound),
                                                          st.lists(st.integers(0, bound - 1), max_size=300))))
def test_dense_groups_are_np_unique_s(case: tuple[int, list[int]]) -> None:
    bound, ids = case
    arr = np.array(ids, dtype=np.int64)
    first, inv = dense_groups(arr, bound)
    _, want_first, want_inv = np.unique(arr, return_index=True, return_inverse=True)
    assert np.array_equal(first, want_first) and np.array_equal(inv, want_inv.reshape(-1))
