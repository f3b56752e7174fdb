"""Placement policies: what a policy is (`base`), the registry every caller picks from (`registry`), and
vramfit's fragmentation-aware policy in parts: the workload mix (`mix`), the measure (`frag_measure`), its
cached tables (`frag_tables`), the policy (`frag_aware`) and its LP-dual variant (`frag_dual`).

The registry's names are re-exported: `from packing.policies import get_policy`."""

from packing.policies import registry
from packing.policies.registry import *  # noqa: F403  (the registry's public names, listed once there)

__all__ = registry.__all__
