"""Placement policies: what a policy is (`base`), the registry every caller picks from (`registry`), and
vramfit's fragmentation-aware policy in parts: the workload mix (`mix`), the measure (`frag_measure`), its
cached tables (`frag_tables`), the policy (`frag_aware`) and its LP-dual variant (`frag_dual`).

The registry's names are re-exported: `from packing.policies import get_policy`."""

from packing.policies.registry import (
    DEFAULT_POLICY,
    BasePolicy,
    BestFit,
    FirstFit,
    Guarded,
    Policy,
    PolicyEntry,
    PolicyErrorHook,
    PolicyFactory,
    Spread,
    WholeGpu,
    describe_policies,
    get_policy,
    k_smallest_sum,
    policy_factory,
    policy_names,
    register,
    takes_param,
    unit_take,
)

__all__ = [
    "DEFAULT_POLICY", "BasePolicy", "BestFit", "FirstFit", "Guarded", "Policy", "PolicyEntry", "PolicyErrorHook",
    "PolicyFactory", "Spread", "WholeGpu", "describe_policies", "get_policy", "k_smallest_sum",
    "policy_factory", "policy_names", "register", "takes_param", "unit_take",
]
