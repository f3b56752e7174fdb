"""Rows grouped by small dense ids (the ids an interner hands out), by counting instead of sorting.

`np.unique(ids, return_index=True, return_inverse=True)` sorts; on the few thousand rows a verb groups it costs
~0.18 ms where counting into an array as long as the id range costs ~0.02 ms, for the same answer.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

IntP = npt.NDArray[np.intp]


def dense_groups(ids: npt.NDArray[np.integer], bound: int) -> tuple[IntP, IntP]:
    """(the position of each distinct id's first row, each row's group), groups in id order: what
    `np.unique(ids, return_index=True, return_inverse=True)[1:]` gives, for ids in [0, bound)."""
    present = np.zeros(bound, dtype=bool)
    present[ids] = True
    kinds = np.flatnonzero(present)
    group = np.empty(bound, dtype=np.intp)
    group[kinds] = np.arange(kinds.size)
    inv = group[ids]
    first = np.full(kinds.size, ids.size, dtype=np.intp)
    np.minimum.at(first, inv, np.arange(ids.size))
    return first, inv
