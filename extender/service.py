"""The four extender verbs on the live store, composed from `extender.verbs` (one module per extension point:
`filter`, `prioritize`, `bind`, `preempt`; `shared` holds the demand cache and limits and the core's verdict
per pod shape that they share). Every placement rule comes from `packing`.

Nothing a request teaches can break a later one: a pod is checked against what the cluster could ever hold
(`DemandLimits`) before it is remembered or learnt from, and the policy is `Guarded` (its failure costs the
pod its polish, best-fit units or neutral scores, never the verb). Bind places only pods that are pending for
vramfit's scheduler and that a filter call named within `bind_filter_window_s`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

from extender import wire
from extender.admission import AdmissionGate
from extender.binder import Binder
from extender.metrics import Metrics
from extender.store import Store
from extender.verbs.bind import Bind
from extender.verbs.filter import Filter, FilterMemory
from extender.verbs.preempt import Preempt
from extender.verbs.prioritize import Prioritize
from extender.verbs.shared import Shared
from packing.policies import Policy


class Extender:
    """One store, binder and policy behind the four verbs; each verb is its module's callable."""

    def __init__(self, store: Store, binder: Binder, policy: Policy, metrics: Metrics, *,
                 scheduler_names: Iterable[str] = ("vramfit-scheduler",), filter_window_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic, planner: Any = None, shortlist_k: int = 0) -> None:
        """`planner`: an `extender.planning.planner.Planner` whose plan prioritize and bind follow (None: planning off).
        `shortlist_k`: filter passes only the best K fitting nodes by the policy when a pod fits many (0: all)."""
        self.store = store
        self.binder = binder
        self.policy = policy  # as configured; the verbs call it through `shared.guarded`
        self.metrics = metrics
        self.shared = Shared(store, policy, metrics)
        self.shared.planner = planner
        self.policy_errors = self.shared.policy_errors
        self.demands = self.shared.demands
        self.memory = FilterMemory(filter_window_s, clock)  # filter's record of the pods it named, bind's check
        self._filter = Filter(self.shared, self.memory, metrics, shortlist_k=shortlist_k)
        self._prioritize = Prioritize(self.shared)
        self._bind = Bind(self.shared, self.memory, binder, metrics, scheduler_names)
        self._preempt = Preempt(self.shared, metrics)

    @property
    def clock(self) -> Callable[[], float]:
        return self.memory.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.memory.clock = clock

    @property
    def scheduler_names(self) -> frozenset[str]:
        return self._bind.scheduler_names

    @property
    def filter_window_s(self) -> float:
        return self.memory.window_s

    def filter(self, args: wire.ExtenderArgs) -> dict[str, Any]:
        """ExtenderFilterResult: the requested nodes the pod fits now; the others with their reasons."""
        return self._filter(args)

    def prioritize(self, args: wire.ExtenderArgs) -> bytes:
        """HostPriorityList, encoded: the policy's scores of the requested nodes, 0..10."""
        return self._prioritize(args)

    def bind(self, args: wire.ExtenderBindingArgs) -> dict[str, str]:
        """ExtenderBindingResult: the pod's units reserved and its Binding written, or the reason not."""
        return self._bind(args)

    def bind_turn(self, gate: AdmissionGate, args: wire.ExtenderBindingArgs) -> AbstractAsyncContextManager[None]:
        """Around `bind` on the event loop (live clusters): its units booked at once, then its turn at the gate."""
        return self._bind.turn(gate, args)

    def preempt(self, args: wire.ExtenderPreemptionArgs) -> bytes:
        """ExtenderPreemptionResult, encoded: per candidate node the fewest victims that make room."""
        return self._preempt(args)
