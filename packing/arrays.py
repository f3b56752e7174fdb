"""The numpy array aliases the core's type hints use (one set for every module)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
I16 = npt.NDArray[np.int16]
I8 = npt.NDArray[np.int8]
B = npt.NDArray[np.bool_]
Int = npt.NDArray[np.integer[Any]]  # any integer dtype
