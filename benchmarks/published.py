"""The FGD paper's published numbers on the default trace (authors' cached results, 10 seeds, tune 1.3).

Source: shared/reference/fgd-benchmark.md §3 (exact values from the artifact's CSVs, "2023_0511").
"""

from __future__ import annotations

PAPER_NAMES: dict[str, str] = {
    "paper:random": "Random",
    "paper:dotprod": "DotProd",
    "paper:clustering": "GpuClustering",
    "paper:packing": "GpuPacking",
    "paper:bestfit": "BestFit",
    "paper:fgd": "FGD",
}

# GPU allocation ratio (%) against arrived workload (%), default trace.
ALLOC: dict[str, dict[int, float]] = {
    "paper:random": {60: 59.73, 80: 78.66, 90: 85.02, 95: 85.72, 100: 86.30, 110: 86.88, 120: 87.28, 130: 87.47},
    "paper:dotprod": {60: 60.00, 80: 80.02, 90: 89.98, 95: 90.58, 100: 90.62, 110: 90.70, 120: 90.76, 130: 90.85},
    "paper:clustering": {60: 60.00, 80: 80.02, 90: 89.98, 95: 91.60, 100: 91.65, 110: 91.73, 120: 91.80,
                         130: 91.88},
    "paper:packing": {60: 60.00, 80: 80.02, 90: 89.98, 95: 91.74, 100: 91.78, 110: 91.85, 120: 91.92, 130: 92.00},
    "paper:bestfit": {60: 60.00, 80: 80.02, 90: 89.99, 95: 92.82, 100: 92.86, 110: 92.94, 120: 93.00, 130: 93.08},
    "paper:fgd": {60: 60.00, 80: 80.02, 90: 89.98, 95: 94.90, 100: 95.23, 110: 95.30, 120: 95.35, 130: 95.39},
}

# Unallocated GPU (%) = 100 - allocation, as the paper's Fig. 9a plots it.
UNALLOCATED: dict[str, dict[int, float]] = {
    "paper:random": {95: 14.28, 100: 13.70, 130: 12.53},
    "paper:dotprod": {95: 9.42, 100: 9.38, 130: 9.15},
    "paper:clustering": {95: 8.40, 100: 8.35, 130: 8.12},
    "paper:packing": {95: 8.26, 100: 8.22, 130: 8.00},
    "paper:bestfit": {95: 7.18, 100: 7.14, 130: 6.92},
    "paper:fgd": {95: 5.09, 100: 4.77, 130: 4.61},
}

# Standard deviation of allocation % across seeds at 130 % arrival.
ALLOC_STD_130: dict[str, float] = {
    "paper:random": 0.32, "paper:dotprod": 0.20, "paper:clustering": 0.62, "paper:packing": 0.54,
    "paper:bestfit": 0.13, "paper:fgd": 0.08,
}

# Fragmentation rate (frag / idle, %) and amount (% of cluster GPUs).
FRAG_RATE: dict[str, dict[int, float]] = {
    "paper:random": {60: 38.4, 80: 74.6, 90: 96.7},
    "paper:dotprod": {60: 28.6, 80: 50.5, 90: 94.2},
    "paper:clustering": {60: 28.0, 80: 46.9, 90: 84.3},
    "paper:packing": {60: 27.8, 80: 46.4, 90: 83.6},
    "paper:bestfit": {60: 24.9, 80: 41.5, 90: 74.1},
    "paper:fgd": {60: 19.9, 80: 29.9, 90: 50.0},
}
FRAG_AMOUNT: dict[str, dict[int, float]] = {
    "paper:random": {60: 15.45, 80: 15.92, 90: 14.48, 130: 12.43},
    "paper:dotprod": {60: 11.43, 80: 10.09, 90: 9.43, 130: 9.08},
    "paper:clustering": {60: 11.19, 80: 9.36, 90: 8.44, 130: 8.00},
    "paper:packing": {60: 11.12, 80: 9.28, 90: 8.37, 130: 7.91},
    "paper:bestfit": {60: 9.97, 80: 8.29, 90: 7.41, 130: 6.85},
    "paper:fgd": {60: 7.96, 80: 5.97, 90: 5.00, 130: 4.57},
}

# The reproduction targets of issue 4: |ours - paper| at 100 % arrival, in points of unallocated GPU.
TOLERANCE_AT_100: dict[str, float] = {
    "paper:random": 1.0, "paper:dotprod": 1.0, "paper:clustering": 1.0, "paper:packing": 1.0,
    "paper:bestfit": 0.5, "paper:fgd": 0.5,
}
