"""CP-SAT building blocks shared by the batch solvers (`packing.solvers.optimal`, `packing.solvers.capacity`, `packing.solvers.bound`,
`packing.solvers.repartition`): slots and classes, the model and its stages, hints and extraction, MIG layouts."""
