"""Kubernetes resource quantities (`"14Gi"`, `"500m"`, `"1.5"`, `"2e3"`) as exact numbers.

Kubernetes accepts binary suffixes (Ki..Ei), decimal suffixes (n, u, m, k, M, G, T, P, E) and decimal
exponents. Fractions keep the arithmetic exact so `"14Gi"` is exactly 14336 MiB.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_PATTERN = re.compile(r"^([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE]([+-]?\d+))?$")

MIB = 2**20


def parse_quantity(text: object) -> Fraction:
    """Parse a quantity into base units (bytes for memory, cores for CPU). Raises ValueError."""
    if isinstance(text, bool):
        raise ValueError(f"expected a quantity string, got {text!r}")
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        if not math.isfinite(text):
            raise ValueError(f"not a finite quantity: {text!r}")
        return Fraction(text)
    if not isinstance(text, str):
        raise ValueError(f"expected a quantity string, got {type(text).__name__}")
    match = _PATTERN.match(text.strip())
    if not match:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    sign, number, suffix, exponent = match.groups()
    value = Fraction(number)
    if suffix in _BINARY:
        value *= _BINARY[suffix]
    elif suffix is not None:
        value *= _DECIMAL[suffix]
    elif exponent is not None:
        exp = int(exponent)
        if abs(exp) > 30:
            raise ValueError(f"quantity exponent out of range: {text!r}")
        value *= Fraction(10) ** exp
    return -value if sign == "-" else value


def quantity_to_mib(text: object) -> int:
    """Bytes quantity -> MiB, rounded up (a pod asking 1 byte more than 14Gi needs 14337 MiB)."""
    return math.ceil(parse_quantity(text) / MIB)


def cpu_to_milli(text: object) -> int:
    """CPU quantity -> millicores, rounded up as the API server does."""
    return math.ceil(parse_quantity(text) * 1000)


def count_value(text: object) -> int:
    """An extended-resource count (whole number, e.g. `"14336"` or 2). Raises ValueError otherwise."""
    value = parse_quantity(text)
    if value.denominator != 1:
        raise ValueError(f"must be a whole number, got {text!r}")
    return int(value)
