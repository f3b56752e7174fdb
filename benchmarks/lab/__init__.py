"""Experiment drivers over the replay harness (`benchmarks.replay`): policy variants (`policy_lab`) and the
dual-price variants of frag-dual (`dual_lab`). Measured, reported in POLICY_NOTES.md; not part of the trace replay bench (`python -m benchmarks`)."""
