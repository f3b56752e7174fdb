"""What a placement policy is (`Policy`), the shared plumbing of the core's policies (`BasePolicy`, the
vectorised helpers), the four plain policies, and `Guarded`, which keeps a failing policy from failing a verb.

A policy scores every feasible node for a pod (vectorised over the state's numpy views) and chooses the
units inside the chosen node. Feasibility is never a policy's business: `fit.feasible` decides it. The
registry of names lives in `packing.policies`, which imports this module and the policy modules.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Protocol

import numpy as np

from packing import fit
from packing.model import Assignment, PodDemand
from packing.state import ClusterState
from packing.views import INSTANCED_CODE


class Policy(Protocol):
    name: str
    whole_gpu: bool

    def score(self, state: ClusterState, pod: PodDemand, feasible_now: np.ndarray) -> np.ndarray:
        """[N] float, higher is better; entries where feasible_now is False are ignored."""
        ...

    def choose(self, state: ClusterState, node_index: int, pod: PodDemand) -> Assignment | None:
        """The units the pod gets on the chosen node."""
        ...

    def observe(self, pod: PodDemand) -> None:
        """Learn from a pod that arrived (workload mix); may do nothing."""
        ...


# ------------------------------------------------------------------ helpers for vectorised scorers
def unit_take(state: ClusterState, pod: PodDemand, whole_gpu: bool = False) -> np.ndarray:
    """[N, G] size of the unit the pod would use on each GPU (best-fit unit; 0 where none fits)."""
    v = pod.vram_mib
    if whole_gpu:
        return np.where(state.idle & (state.vram >= v), state.vram, 0)
    # Exclusive: the whole GPU; MPS with replicas: the fixed share; pinned MPS / time-slicing: the free pool.
    # unit_max holds exactly that for every non-MIG mode.
    take = np.where(state.unit_max >= v, state.unit_max, 0)
    # MIG: the smallest free instance that fits, not the largest (keeps big instances for big pods).
    return np.where(INSTANCED_CODE[state.mode], state.mig_smallest_fit(v), take)


def k_smallest_sum(values: np.ndarray, ok: np.ndarray, k: int) -> np.ndarray:
    """[N] sum of the k smallest values among ok entries per row (a huge number where fewer than k)."""
    big = np.int64(1) << 40
    masked = np.where(ok, values, big)
    if k == 1:
        return masked.min(axis=1)
    return np.sort(masked, axis=1)[:, :k].sum(axis=1)


class BasePolicy:
    """Shared plumbing: unit choice inside the node and a no-op observe."""

    name = "base"
    whole_gpu = False
    gpu_order = "best"

    def score(self, state: ClusterState, pod: PodDemand, feasible_now: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def choose(self, state: ClusterState, node_index: int, pod: PodDemand) -> Assignment | None:
        return fit.choose_units(state, state.node_at(node_index).name, pod, self.whole_gpu, self.gpu_order)

    def observe(self, pod: PodDemand) -> None:
        return None

    def fork(self) -> BasePolicy:
        """An independent copy of what the policy has learnt (a planner plans with it; the live policy goes on)."""
        return copy.deepcopy(self)


def fork_policy(policy: Policy) -> Policy:
    """`policy.fork()` where it has one, else a deep copy: a policy that learns may be planned with, never shared."""
    fork = getattr(policy, "fork", None)
    return fork() if callable(fork) else copy.deepcopy(policy)


class FirstFit(BasePolicy):
    """First node (in cluster order) where the pod fits; tightest unit inside it."""

    name = "first-fit"

    def score(self, state: ClusterState, pod: PodDemand, feasible_now: np.ndarray) -> np.ndarray:
        return -np.arange(len(state), dtype=np.float64)


class BestFit(BasePolicy):
    """Node whose chosen units leave the least VRAM over; then the fullest node (keeps GPUs whole)."""

    name = "best-fit"

    def score(self, state: ClusterState, pod: PodDemand, feasible_now: np.ndarray) -> np.ndarray:
        if pod.gpu_count == 0:
            return -(state.cpu_free.astype(np.float64))
        take = unit_take(state, pod, self.whole_gpu)
        leftover = k_smallest_sum(take, take > 0, pod.gpu_count) - pod.gpu_count * pod.vram_mib
        # Lexicographic in one float: least leftover in the chosen units, then least free VRAM on the node.
        return -(np.minimum(leftover, 10**7).astype(np.float64) * 1e8 + state.node_free)


class Spread(BasePolicy):
    """Node with the most free VRAM (least allocated): spreads load, keeps headroom per node."""

    name = "spread"
    gpu_order = "spread"

    def score(self, state: ClusterState, pod: PodDemand, feasible_now: np.ndarray) -> np.ndarray:
        return state.node_free.astype(np.float64)


class WholeGpu(BasePolicy):
    """Plain Kubernetes: every GPU pod takes a whole physical GPU; least-allocated node first."""

    name = "whole-gpu"
    whole_gpu = True

    def score(self, state: ClusterState, pod: PodDemand, feasible_now: np.ndarray) -> np.ndarray:
        total = np.maximum(state.present.sum(axis=1), 1)
        return (state.present & state.idle).sum(axis=1) / total


PolicyErrorHook = Callable[[str, PodDemand, Exception], None]


class Guarded:
    """A policy whose failures cost one pod's polish, never a verb: an exception from `score` gives neutral
    scores (every feasible node the same), one from `choose` the plain best-fit units (`fit.choose_units`),
    one from `observe` is dropped. `on_error(what, pod, error)` hears of each (log it, count it).

    A learning policy's state is built from what it was shown; if that ever breaks its arithmetic, every
    later pod would fail the same way until the state moves on. Feasibility never comes from the policy,
    so the fallbacks place only where the pod fits."""

    def __init__(self, inner: Policy, on_error: PolicyErrorHook) -> None:
        self.inner = inner
        self.on_error = on_error
        self.name = inner.name
        self.whole_gpu = inner.whole_gpu

    def score(self, state: ClusterState, pod: PodDemand, feasible_now: np.ndarray) -> np.ndarray:
        try:
            return self.inner.score(state, pod, feasible_now)
        except Exception as err:  # noqa: BLE001 - any failure of the policy, by design
            self.on_error("score", pod, err)
            return np.zeros(len(state), dtype=np.float64)

    def choose(self, state: ClusterState, node_index: int, pod: PodDemand) -> Assignment | None:
        try:
            return self.inner.choose(state, node_index, pod)
        except Exception as err:  # noqa: BLE001
            self.on_error("choose", pod, err)
            return fit.choose_units(state, state.node_at(node_index).name, pod, self.whole_gpu)

    def observe(self, pod: PodDemand) -> None:
        try:
            self.inner.observe(pod)
        except Exception as err:  # noqa: BLE001
            self.on_error("observe", pod, err)
