"""CP-SAT building blocks shared by the batch solvers (`packing.optimal`, `packing.capacity`, `packing.bound`,
`packing.repartition`): slots and classes, the model and its stages, hints and extraction, MIG layouts."""
