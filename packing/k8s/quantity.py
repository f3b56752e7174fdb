"""Kubernetes resource quantities (`"14Gi"`, `"500m"`, `"1.5"`, `"2e3"`) as exact numbers.

Kubernetes accepts binary suffixes (Ki..Ei), decimal suffixes (n, u, m, k, M, G, T, P, E) and decimal
exponents. Fractions keep the arithmetic exact so `"14Gi"` is exactly 14336 MiB.

VRAM (`vramfit.io/vram`, the resource and the annotation alike) has one rule, `vram_to_mib`:

- a bare number is MiB: `"14336"`, `"16e3"` (a whole number; `"1.5"` is an error);
- a quantity with a unit is bytes, rounded up to whole MiB: `"14Gi"` = 14336, `"14G"` = 13352, `"500Mi"` = 500,
  `"1.5Gi"` = 1536;
- except `k`, which counts thousands of MiB (`"16k"` = 16000): the API server stores a bare multiple of 1000
  in canonical form, so a pod written with `vramfit.io/vram: "16000"` is read back as `"16k"`, and VRAM in
  kilobytes is never meant. (It does the same with a bare multiple of a million, `"2000000"` -> `"2M"`, which
  then reads as bytes; a million MiB, ~1 TiB per GPU, is more than any GPU has.)
- the result must be 1 MiB .. 16 TiB (`MAX_VRAM_MIB`); anything else, `"1e25"` included, is a ValueError
  with the reason, never a huge number handed on to the arithmetic.

Kubernetes requires extended-resource requests and limits to be whole numbers, which `"14Gi"` is (as bytes),
so both forms reach vramfit in `resources`; the annotation is a plain string and may hold either.
"""

from __future__ import annotations

import functools
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
MAX_VRAM_MIB = 16 * 2**20  # 16 TiB: above any GPU (a pod too large for every GPU is rejected elsewhere)
_MAX_CHARS = 64  # the longest real quantity is ~25 characters; a megabyte of digits is not one
_MIB_COUNT_SUFFIXES = (None, "k")  # the forms in which a vramfit.io/vram value counts MiB, not bytes


def parse_quantity(text: object) -> Fraction:
    """Parse a quantity into base units (bytes for memory, cores for CPU). Raises ValueError."""
    return split_quantity(text)[0]


def split_quantity(text: object) -> tuple[Fraction, str | None]:
    """A quantity -> (value in base units, its unit suffix). The suffix is None for a bare number, with or
    without a decimal exponent (`"2e3"`), and for JSON numbers. Raises ValueError."""
    if isinstance(text, str):
        return _split_text(text)  # a cluster repeats a few strings ("80Gi", "1Mi") tens of thousands of times
    return _split(text)


@functools.lru_cache(maxsize=8192)
def _split_text(text: str) -> tuple[Fraction, str | None]:
    return _split(text)


def _split(text: object) -> tuple[Fraction, str | None]:
    if isinstance(text, bool):
        raise ValueError(f"expected a quantity string, got {text!r}")
    if isinstance(text, int):
        return Fraction(text), None
    if isinstance(text, float):
        if not math.isfinite(text):
            raise ValueError(f"not a finite quantity: {text!r}")
        return Fraction(text), None
    if not isinstance(text, str):
        raise ValueError(f"expected a quantity string, got {type(text).__name__}")
    if len(text) > _MAX_CHARS:
        raise ValueError(f"not a Kubernetes quantity: {text[:20]!r}... ({len(text)} characters)")
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
    return (-value if sign == "-" else value), suffix


def vram_to_mib(text: object) -> int:
    """A `vramfit.io/vram` value (resource or annotation) -> MiB, by the module's one rule. Raises ValueError."""
    value, suffix = split_quantity(text)
    if suffix in _MIB_COUNT_SUFFIXES:
        if value.denominator != 1:
            raise ValueError(f"a bare number counts whole MiB, got {text!r} (for a fraction of a GiB write e.g. 1.5Gi)")
        if value < 1:
            raise ValueError(f"must be at least 1 MiB, got {text!r}")
        if value > MAX_VRAM_MIB:
            raise ValueError(f"{text!r} MiB is more than 16 TiB (a bare number counts MiB; "
                             "for bytes give a unit, e.g. 14Gi)")
        return int(value)
    if value < MIB:
        raise ValueError(f"{text!r} is less than 1 MiB (a quantity with a unit counts bytes; "
                         "a bare number counts MiB)")
    if value > MAX_VRAM_MIB * MIB:
        raise ValueError(f"{text!r} is more than 16 TiB")
    return math.ceil(value / MIB)


def quantity_to_mib(text: object) -> int:
    """Bytes quantity -> MiB, rounded up (a pod asking 1 byte more than 14Gi needs 14337 MiB)."""
    return bytes_to_mib(parse_quantity(text))


def bytes_to_mib(value: Fraction) -> int:
    """An exact byte count -> whole MiB, rounded up: what is booked never counts less than what is used."""
    return math.ceil(value / MIB)


def cpu_to_milli(text: object) -> int:
    """CPU quantity -> millicores, rounded up as the API server does."""
    return math.ceil(parse_quantity(text) * 1000)


def count_value(text: object) -> int:
    """An extended-resource count (whole number, e.g. `"14336"` or 2). Raises ValueError otherwise."""
    value = parse_quantity(text)
    if value.denominator != 1:
        raise ValueError(f"must be a whole number, got {text!r}")
    return int(value)


def format_quantity(value: Fraction) -> str:
    """A value as a quantity string that parses back to it: whole multiples of 1024^k with a binary suffix (`14Gi`),
    other whole numbers bare, fractions in the coarsest of milli, micro or nano units that is exact (`1500m`,
    `2500u`, `7n`). A Kubernetes quantity has no unit below nano, so a value that is not a whole number of nano
    units cannot be one: it is rounded away from zero to the next nano unit (as the API server rounds), so a
    consumption is never written as less than it is."""
    if value.denominator == 1:
        n = value.numerator
        for suffix, factor in sorted(_BINARY.items(), key=lambda kv: -kv[1]):
            if n and n % factor == 0:
                return f"{n // factor}{suffix}"
        return str(n)
    nano = math.ceil(abs(value) * 10**9) * (-1 if value < 0 else 1)
    if nano % 10**9 == 0:  # rounding up reached a whole number
        return format_quantity(Fraction(nano // 10**9))
    for suffix, per in (("m", 10**6), ("u", 10**3)):
        if nano % per == 0:
            return f"{nano // per}{suffix}"
    return f"{nano}n"
