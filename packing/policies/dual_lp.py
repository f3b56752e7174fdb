"""The packing LP behind vramfit's dual gap values: the arc-flow LP's duals (`solve_duals`), the gap values they
imply (`gap_values`, an unbounded knapsack) and the grid they are solved on (`grid_step`). What they mean and how
the policy uses them: `packing.policies.frag_dual`, which re-exports these names."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packing.arrays import F64


def gap_values(prices: Mapping[int, float], top: int) -> F64:
    """val[g] for g = 0..top (grid units): the most total price of a multiset of sizes fitting in g.

    Unbounded knapsack by dynamic programming; monotone in g since val[g] >= val[g - 1].
    Non-positive prices never help and are skipped."""
    val = np.zeros(top + 1, dtype=np.float64)
    items = [(int(s), float(p)) for s, p in prices.items() if 0 < int(s) <= top and p > 0]
    for g in range(1, top + 1):
        best = val[g - 1]
        for s, p in items:
            if s <= g:
                cand = val[g - s] + p
                if cand > best:
                    best = cand
        val[g] = best
    return val


@dataclass(frozen=True)
class DualSolution:
    """Dual prices of one LP solve, on a grid of `step` VRAM units per cell and `top` cells per GPU."""

    step: int
    top: int
    price: dict[int, float]  # size in cells -> y_s, the GPU space (VRAM units) an item of that size is worth
    pi: dict[int, float]  # size in cells -> dual of its count row
    packed: float  # LP optimum (VRAM units packed)
    val: F64  # [top + 1] gap values in VRAM units
    used: dict[int, float] = field(default_factory=dict)  # size in cells -> items the optimum packs (if asked)


def same_values(a: DualSolution | None, b: DualSolution | None) -> bool:
    """Whether two solutions price every gap alike (the same grid and gap values): all a score reads of one. A
    re-solve on a steady mix mostly gives back the values it had."""
    return (a is not None and b is not None and a.step == b.step and a.top == b.top
            and np.array_equal(a.val, b.val))


def solve_duals(expected: Mapping[int, float], gpus_by_fill: Mapping[int, float], top: int, step: int,
                perturb: float = 1e-6, at_least: Mapping[int, float] | None = None,
                primal: bool = False) -> DualSolution:
    """Solve the arc-flow LP (module docstring) and return its duals and the gap values they imply.

    expected: size in cells -> expected items; gpus_by_fill: fill level in cells (0 = idle GPU) -> GPUs.
    perturb: each size's value is s * (1 + perturb * s / top); a tiny preference for big items that makes
    the LP's optimal face (and so its duals) less degenerate without changing what fits.
    at_least: size in cells -> items of that size the packing must hold (a conditional bound: what the best
    packing is once a scheduler has placed that many; `benchmarks/waste_anatomy.py`). An infeasible floor
    raises RuntimeError.
    primal: also read the optimum's items per size into `.used` (a benchmark's question; reading every arc
    costs ~10 % of a solve, which the policy, solving inside a verb, does not pay).
    """
    from ortools.linear_solver import pywraplp

    solver = pywraplp.Solver.CreateSolver("GLOP")
    if solver is None:  # pragma: no cover - GLOP ships with ortools
        raise RuntimeError("GLOP is not available")
    inf = solver.infinity()
    sizes = sorted(int(s) for s, n in expected.items() if 0 < int(s) <= top and n > 0)
    node_rows = [solver.Constraint(-inf, float(gpus_by_fill.get(a, 0.0))) for a in range(top)]
    floor = at_least or {}
    count_rows = {s: solver.Constraint(min(float(floor.get(s, -inf)), float(expected[s])), float(expected[s]))
                  for s in sizes}
    arcs: list[tuple[int, Any]] = []
    objective = solver.Objective()
    objective.SetMaximization()
    for a in range(top):
        if a + 1 < top:  # waste arc a -> a + 1 (the last one, into the sink, needs no row)
            w = solver.NumVar(0.0, inf, "")
            node_rows[a].SetCoefficient(w, 1.0)
            node_rows[a + 1].SetCoefficient(w, -1.0)
        for s in sizes:
            if a + s > top:
                break
            x = solver.NumVar(0.0, inf, "")
            node_rows[a].SetCoefficient(x, 1.0)
            if a + s < top:
                node_rows[a + s].SetCoefficient(x, -1.0)
            count_rows[s].SetCoefficient(x, 1.0)
            objective.SetCoefficient(x, float(s * step) * (1.0 + perturb * s / top))
            arcs.append((s, x))
    status = solver.Solve()
    if status != pywraplp.Solver.OPTIMAL:
        raise RuntimeError(f"packing LP not solved (status {status})")
    pi = {s: max(0.0, float(count_rows[s].dual_value())) for s in sizes}
    # y_s: the GPU space an item of size s is worth (its size minus its scarcity surplus), >= 0.
    price = {s: max(0.0, s * step * (1.0 + perturb * s / top) - pi[s]) for s in sizes}
    used: Counter[int] = Counter()
    for s, x in arcs if primal else ():
        used[s] += x.solution_value()  # type: ignore[assignment]
    return DualSolution(step=step, top=top, price=price, pi=pi, packed=float(objective.Value()),
                        val=gap_values(price, top), used=dict(used))


def grid_step(sizes: list[int], full: int, cells: int = 100) -> int:
    """Grid step in VRAM units: the gcd of the sizes and the GPU size, coarsened to at most ~`cells` per GPU
    (trace sizes are multiples of 10 milli: a 100-cell grid is exact there)."""
    g = full
    for s in sizes:
        g = math.gcd(g, int(s))
    return g if full // max(g, 1) <= 4 * cells else max(1, full // cells)
