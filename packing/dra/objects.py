"""DRA objects as the core reads them: devices of ResourceSlices, DeviceClasses, ResourceClaims and the
allocations written into them. Field names follow `resource.k8s.io/v1` (kubernetes/api `resource/v1/types.go`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from packing.dra.cel import CelDevice, Semver, qualify

AttrValue = int | bool | str | Semver

FINALIZER = "resource.kubernetes.io/delete-protection"  # resourceapi.Finalizer
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"  # annotation on claims made from a template
GATE = "vramfit.io/allocate"  # the scheduling gate vramfit holds a pod with until its claims are allocated
MAX_RESULTS = 32  # AllocationResultsMaxSize
MAX_RESERVED_FOR = 256  # ResourceClaimReservedForMaxSize


@dataclass(frozen=True)
class DeviceId:
    """A device's identity in the cluster: `<driver>/<pool>/<device>`."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True)
class RequestPolicy:
    """A consumable capacity's `requestPolicy`: what an allocation consumes for what it asks (KEP-5075)."""

    default: Fraction | None = None
    min: Fraction | None = None
    max: Fraction | None = None
    step: Fraction | None = None
    valid_values: tuple[Fraction, ...] = ()


@dataclass(frozen=True)
class Capacity:
    value: Fraction
    policy: RequestPolicy | None = None


@dataclass(frozen=True)
class CounterUse:
    counter_set: str
    counters: tuple[tuple[str, Fraction], ...]


@dataclass(frozen=True)
class Device:
    """One device of a ResourceSlice; attribute and capacity names as published (no domain: the driver's)."""

    id: DeviceId
    node: str | None  # the node whose pool it is (`spec.nodeName`); None: not node-local
    attributes: dict[str, AttrValue] = field(default_factory=dict, compare=False, hash=False)
    capacity: dict[str, Capacity] = field(default_factory=dict, compare=False, hash=False)
    allow_multiple: bool = False
    consumes: tuple[CounterUse, ...] = ()
    tainted: bool = False  # NoSchedule/NoExecute taints: not allocated by vramfit
    capacity_key: str = field(default="", compare=False)  # the capacities as published: devices alike share it

    def cel(self) -> CelDevice:
        d = self.id.driver
        return CelDevice(driver=d, attributes={qualify(k, d): v for k, v in self.attributes.items()},
                         capacity={qualify(k, d): c.value for k, c in self.capacity.items()},
                         allow_multiple=self.allow_multiple)

    def attribute(self, name: str) -> AttrValue | None:
        """An attribute by its qualified name or, in the driver's domain, its bare name."""
        domain, _, bare = name.rpartition("/")
        if domain in ("", self.id.driver):
            return self.attributes.get(bare, self.attributes.get(name))
        return self.attributes.get(name)

    def capacity_of(self, name: str) -> tuple[str, Capacity] | None:
        """(published name, capacity) of a capacity named qualified or bare; None: the device lacks it."""
        domain, _, bare = name.rpartition("/")
        for key in ((bare, name) if domain in ("", self.id.driver) else (name,)):
            if key in self.capacity:
                return key, self.capacity[key]
        return None


@dataclass(frozen=True)
class Pool:
    """The newest complete generation of one pool: its devices and counter sets."""

    driver: str
    name: str
    generation: int
    node: str | None
    devices: tuple[Device, ...]
    counter_sets: dict[str, dict[str, Fraction]] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class OpaqueConfig:
    """One `{requests, opaque: {driver, parameters}}` entry, kept as written: the driver reads it."""

    requests: tuple[str, ...]
    driver: str
    parameters: object


@dataclass(frozen=True)
class DeviceClass:
    name: str
    selectors: tuple[str, ...]
    config: tuple[OpaqueConfig, ...] = ()


@dataclass(frozen=True)
class ExactRequest:
    """One `exactly` request (or one `firstAvailable` subrequest: `name` is then `<request>/<subrequest>`)."""

    name: str
    device_class: str
    selectors: tuple[str, ...] = ()
    all_devices: bool = False  # allocationMode All
    count: int = 1
    capacity: dict[str, Fraction] = field(default_factory=dict, compare=False, hash=False)  # qualified names
    admin_access: bool = False


@dataclass(frozen=True)
class Request:
    """A claim's request: one `exactly`, or the `firstAvailable` alternatives in order."""

    name: str
    alternatives: tuple[ExactRequest, ...]


@dataclass(frozen=True)
class Constraint:
    requests: tuple[str, ...]  # empty: all requests
    match_attribute: str | None = None
    distinct_attribute: str | None = None


@dataclass(frozen=True)
class ResultDevice:
    """One `status.allocation.devices.results[]` entry."""

    request: str
    device: DeviceId
    share_id: str | None = None
    consumed: dict[str, Fraction] | None = field(default=None, compare=False, hash=False)  # qualified names


@dataclass(frozen=True)
class Allocation:
    results: tuple[ResultDevice, ...]
    node: str | None  # the node its nodeSelector names (None: none, or not one node)


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Claim:
    ref: ClaimRef
    uid: str
    resource_version: str
    requests: tuple[Request, ...]
    constraints: tuple[Constraint, ...] = ()
    config: tuple[OpaqueConfig, ...] = ()
    allocation: Allocation | None = None
    reserved_for: tuple[str, ...] = ()  # consumer UIDs
    finalizers: tuple[str, ...] = ()
    deleting: bool = False
    owner_pod_uid: str | None = None  # the controlling Pod (claims made from a template)
