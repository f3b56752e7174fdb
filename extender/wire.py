"""Wire models of `k8s.io/kube-scheduler/extender/v1`.

The Go structs carry no json tags, so every key is the Go field name (`Pod`, `NodeNames`, ...), nil
values travel as `null`, and Go's decoder matches keys case-insensitively. The nested Pod/Node objects
are the API server's own JSON and stay plain dicts here: `packing` parses them, once, at its edge.

Responses are built as plain dicts/lists by the helpers at the bottom (the hot path answers thousands of
names per call); the pydantic result models document and test the same shapes.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Container
from typing import Annotated, Any, TypeVar

import numpy as np

try:  # optional speed-up: the hot path parses and writes thousands of node names per call
    import orjson
except ImportError:  # pragma: no cover - plain json gives the same results, slower
    orjson = None  # type: ignore[assignment]
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

MIN_EXTENDER_PRIORITY = 0
MAX_EXTENDER_PRIORITY = 10
# Free-form API objects (Pod, Node) are kept and written back (filter echoes Nodes). A Kubernetes object is
# ~10 levels deep; the encoder refuses beyond 254 and the stdlib parser recurses, so refuse well before.
MAX_DEPTH = 64
# What the encoder writes back: int64 and uint64. orjson reads a longer integer literal as a float, so a
# float of that size is refused too (no API object holds one).
_INT_LOW, _INT_HIGH = -(2**63), 2**64
_FLOAT_LIMIT = float(2**63)


class WireError(ValueError):
    """A request the extender cannot decode; the message names the problem (answered with HTTP 400)."""


def _fold(key: str) -> str:
    # Go's encoding/json compares with Unicode simple case folding; casefold() is the closest stdlib fold.
    return key.casefold()


class GoStruct(BaseModel):
    """A Go struct without json tags: keys are field names, matched case-insensitively like Go.

    Go walks the object's keys in order and stores each into the field whose name equals it exactly or,
    failing that, case-insensitively; so with `{"Pod": a, "pod": b}` the last one (`b`) wins.
    Unknown keys are ignored, as Go does.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _go_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data  # pydantic reports the type error itself
        fields, folded = _field_names(cls)
        if all(key in fields for key in data):
            return data  # Go's own spelling, as kube-scheduler sends it (a preempt call holds ~10^5 of these)
        out: dict[str, Any] = {}
        for key, value in data.items():
            if not isinstance(key, str):
                continue
            name = key if key in fields else folded.get(_fold(key))
            if name is not None:
                out[name] = value
        return out


def check_tree(value: Any) -> Any:
    """A free-form JSON value as parsed, unchanged; ValueError when it could not be written back as it came:
    containers nested deeper than MAX_DEPTH, or a number beyond 64 bits. Recursion stops at MAX_DEPTH, so a
    deep value cannot exhaust the stack (the parser already refused beyond 1,024 levels)."""
    _walk(value, 1)
    return value


def _walk(node: Any, depth: int) -> None:
    for v in node.values() if type(node) is dict else node:
        t = type(v)
        if t is dict or t is list:
            if depth >= MAX_DEPTH:
                raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
            _walk(v, depth + 1)
        elif (t is int and not _INT_LOW <= v < _INT_HIGH) or (t is float and abs(v) >= _FLOAT_LIMIT):
            raise ValueError(f"number {v!r} is beyond the 64-bit integer range")


# An API object kept as parsed (packing reads it at its edge), checked to round-trip.
FreeObject = Annotated[dict[str, Any], AfterValidator(check_tree)]


_FIELD_NAMES: dict[type, tuple[frozenset[str], dict[str, str]]] = {}


def _field_names(cls: type[BaseModel]) -> tuple[frozenset[str], dict[str, str]]:
    """A model's field names and their case folds, once per class (pydantic's accessor costs a call each)."""
    hit = _FIELD_NAMES.get(cls)
    if hit is None:
        names = frozenset(cls.model_fields)
        hit = _FIELD_NAMES[cls] = (names, {_fold(name): name for name in names})
    return hit


class NodeList(BaseModel):
    """`v1.NodeList` as kube-scheduler builds it: `{"metadata": {}, "items": [...]}` (API JSON keys)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    metadata: FreeObject | None = None
    items: list[FreeObject] | None = None


def _pod_spec_strings(pod: dict[str, Any]) -> None:
    """The pod fields the verbs compare and remember as names: strings (or absent) in any object the API server
    sends, so anything else is a bad request, not a value to carry into a later bind."""
    spec = pod.get("spec")
    if isinstance(spec, dict):
        for name in ("schedulerName", "nodeName"):
            value = spec.get(name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"Pod.spec.{name} must be a string, got {type(value).__name__}")


class ExtenderArgs(GoStruct):
    """Filter and prioritize request."""

    Pod: FreeObject
    Nodes: NodeList | None = None
    NodeNames: list[StrictStr] | None = None

    @model_validator(mode="after")
    def _names_are_strings(self) -> ExtenderArgs:
        _pod_spec_strings(self.Pod)
        return self


class ExtenderFilterResult(GoStruct):
    Nodes: NodeList | None = None
    NodeNames: list[StrictStr] | None = None
    FailedNodes: dict[str, str] | None = None
    FailedAndUnresolvableNodes: dict[str, str] | None = None
    Error: str = ""


class HostPriority(GoStruct):
    Host: StrictStr
    Score: StrictInt  # int64 in Go: a float here makes kube-scheduler drop every score


class ExtenderBindingArgs(GoStruct):
    PodName: StrictStr
    PodNamespace: StrictStr
    PodUID: StrictStr
    Node: StrictStr


class ExtenderBindingResult(GoStruct):
    Error: str = ""


class MetaPod(GoStruct):
    UID: StrictStr


class MetaVictims(GoStruct):
    Pods: list[MetaPod] | None = None
    NumPDBViolations: StrictInt = 0


class Victims(GoStruct):
    Pods: list[FreeObject] | None = None
    NumPDBViolations: StrictInt = 0


class ExtenderPreemptionArgs(GoStruct):
    Pod: FreeObject
    NodeNameToVictims: dict[str, Victims | None] | None = None
    NodeNameToMetaVictims: dict[str, MetaVictims | None] | None = None


class ExtenderPreemptionResult(GoStruct):
    NodeNameToMetaVictims: dict[str, MetaVictims] | None = Field(default=None)


# ---- decoding -------------------------------------------------------------------------------------


def decode_json(body: bytes) -> Any:
    """Parse a request body as strict JSON (RFC 8259); any failure becomes a WireError naming what is wrong.

    Strict, because the answer is written back by the same encoder: NaN/Infinity, lone surrogates and
    integers beyond 64 bits would parse leniently and then fail on the way out (a 500 for bad input)."""
    if not body:
        raise WireError("empty request body: expected a JSON object")
    if orjson is not None:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise WireError(_json_problem(body, str(exc))) from None
    return _decode_stdlib(body)


def _utf8(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise WireError(f"request body is not UTF-8 JSON (byte {exc.start})") from None


def _json_problem(body: bytes, strict_reason: str) -> str:
    """Why orjson refused a body: the stdlib parser's plain words for a syntax error; where the stdlib would
    have accepted it (NaN, a lone surrogate, 1,025 levels deep), orjson's own reason."""
    try:
        _stdlib_loads(_utf8(body))
    except WireError as err:
        return str(err)
    return f"request body is not strict JSON: {strict_reason}"


def _refuse_constant(name: str) -> Any:
    raise WireError(f"request body is not strict JSON: {name} is not a JSON number")


def _int64(text: str) -> int:
    value = int(text)
    if not _INT_LOW <= value < _INT_HIGH:
        raise WireError(f"request body is not strict JSON: integer {text[:40]} is beyond 64 bits")
    return value


def _stdlib_loads(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_int=_int64)
    except json.JSONDecodeError as exc:
        raise WireError(f"malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise WireError("malformed JSON: nested too deeply") from None


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _decode_stdlib(body: bytes) -> Any:
    """The same strict reading without orjson (slower; lone surrogates found by writing the value back)."""
    text = _utf8(body)
    data = _stdlib_loads(text)
    if _SURROGATE_ESCAPE.search(text):
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise WireError("request body is not strict JSON: a string holds a lone surrogate") from None
    return data


def _describe(exc: ValidationError, what: str) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"]) or "(body)"
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - len(parts)
    tail = f" (+{more} more)" if more > 0 else ""
    return f"invalid {what}: " + "; ".join(parts) + tail


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], body: bytes) -> M:
    """Decode a request body into `model`, raising WireError with a readable reason."""
    data = decode_json(body)
    if not isinstance(data, dict):
        raise WireError(f"invalid {model.__name__}: expected a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise WireError(_describe(exc, model.__name__)) from None


_VICTIM_MAPS = {"NodeNameToMetaVictims": True, "NodeNameToVictims": False}  # field -> meta (UID) form


def parse_preemption(body: bytes, known_node: Callable[[str], bool],
                     known_uids: Callable[[str], Container[str]]) -> ExtenderPreemptionArgs:
    """ExtenderPreemptionArgs with what no answer can use dropped before any model is built: nodes for which
    `known_node` is false, and on the nodes kept, victims whose UID is not in `known_uids(node)` (kube-scheduler
    names only pods on the node, and every one of them is watched). So the models built, and the work after,
    are bounded by the nodes and pods the extender knows, whatever the body names. Entries of the wrong shape are
    kept, so the answer is still 400 naming them."""
    data = decode_json(body)
    if not isinstance(data, dict):
        raise WireError(f"invalid ExtenderPreemptionArgs: expected a JSON object, got {type(data).__name__}")
    fields, folded = _field_names(ExtenderPreemptionArgs)
    maps: dict[str, dict[str, Any]] = {}
    for key, value in list(data.items()):
        name = key if key in fields else folded.get(_fold(key)) if isinstance(key, str) else None
        if name in _VICTIM_MAPS and isinstance(value, dict):
            meta = _VICTIM_MAPS[name]
            kept: dict[str, Any] = {}
            for node, victims in value.items():
                if known_node(node):
                    kept[node] = _known_victims(victims, known_uids(node), meta)
                elif not _well_formed(victims, meta):
                    kept[node] = victims  # for the 400 that names it
            maps[name] = kept  # Go's rule: the last key for a field wins
            data[key] = {}
    try:
        args = ExtenderPreemptionArgs.model_validate(data)
    except ValidationError as exc:
        raise WireError(_describe(exc, "ExtenderPreemptionArgs")) from None
    # Node by node: one validation of the whole map is one call holding the interpreter lock for all of it.
    update: dict[str, Any] = {}
    for name, kept in maps.items():
        model: type[GoStruct] = MetaVictims if _VICTIM_MAPS[name] else Victims
        out: dict[str, Any] = {}
        for k, (node, victims) in enumerate(kept.items()):
            if k % 64 == 0:
                time.sleep(0)  # the event loop may take the interpreter lock here (this runs in a worker thread)
            try:
                out[node] = None if victims is None else model.model_validate(victims)
            except ValidationError as exc:
                raise WireError(_describe(exc, f"ExtenderPreemptionArgs {name}[{node!r}]")) from None
        update[name] = out
    return args.model_copy(update=update) if update else args


def _go_field(obj: dict[str, Any], name: str) -> Any:
    """A Go struct field's value in a JSON object (the last key equal to it, or equal case-insensitively)."""
    if len(obj) == 1 and name in obj:
        return obj[name]
    value = None
    folded = _fold(name)
    for k, v in obj.items():
        if k == name or (isinstance(k, str) and _fold(k) == folded):
            value = v
    return value


def _victim_uid(item: Any, meta: bool) -> str | None:
    """A well-formed victim's UID ("" when it has none), or None when the item is not well-formed."""
    if not isinstance(item, dict):
        return None
    if meta:
        uid = _go_field(item, "UID")
        return uid if isinstance(uid, str) else None
    md = item.get("metadata")
    if md is not None and not isinstance(md, dict):
        return None
    uid = md.get("uid") if md else None
    return uid if isinstance(uid, str) else ""


def _victims_list(victims: Any) -> tuple[Any, bool]:
    """(the Pods value, whether the node's entry has a readable shape so far)."""
    if victims is None:
        return None, True
    if not isinstance(victims, dict):
        return None, False
    pods = _go_field(victims, "Pods")
    return pods, pods is None or isinstance(pods, list)


def _well_formed(victims: Any, meta: bool) -> bool:
    pods, ok = _victims_list(victims)
    return ok and all(_victim_uid(item, meta) is not None for item in pods or ())


def _known_victims(victims: Any, uids: Container[str], meta: bool) -> Any:
    """The node's entry with the well-formed victims that are not among `uids` taken out."""
    pods, ok = _victims_list(victims)
    if not ok or not pods:
        return victims
    kept = [item for item in pods if (uid := _victim_uid(item, meta)) is None or uid in uids]
    if len(kept) == len(pods):
        return victims
    out = {k: v for k, v in victims.items() if not (isinstance(k, str) and _fold(k) == "pods")}
    out["Pods"] = kept
    return out


# ---- encoding (plain JSON-ready values, Go keys) ----------------------------------------------------


def dumps(value: Any) -> bytes:
    """Compact JSON bytes for a response."""
    if orjson is not None:
        return orjson.dumps(value)
    return json.dumps(value, separators=(",", ":")).encode()


def filter_result(
    *,
    node_names: list[str] | None = None,
    nodes: list[dict[str, Any]] | None = None,
    failed: dict[str, str] | None = None,
    unresolvable: dict[str, str] | None = None,
    error: str = "",
) -> dict[str, Any]:
    """ExtenderFilterResult. Exactly one of node_names / nodes carries the survivors (the other is null),
    matching what the scheduler sent; both maps are always present."""
    return {
        "Nodes": None if nodes is None else {"metadata": {}, "items": nodes},
        "NodeNames": node_names,
        "FailedNodes": failed if failed is not None else {},
        "FailedAndUnresolvableNodes": unresolvable if unresolvable is not None else {},
        "Error": error,
    }


def host_priorities(scores: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """HostPriorityList: a bare JSON array; Score is always an int."""
    return [{"Host": host, "Score": int(score)} for host, score in scores]


def host_prefix(host: str) -> bytes:
    """`{"Host":"<host>","Score":` - the part of a HostPriority that depends only on the node (cached per node)."""
    return b'{"Host":' + dumps(host) + b',"Score":'


# `<score>},` / `<score>}` for every legal score: a HostPriority is its host prefix plus one of these.
_SCORE_ITEM = np.array([f"{s}}},".encode() for s in range(MIN_EXTENDER_PRIORITY, MAX_EXTENDER_PRIORITY + 1)],
                       dtype=object)
_SCORE_LAST = np.array([f"{s}}}".encode() for s in range(MIN_EXTENDER_PRIORITY, MAX_EXTENDER_PRIORITY + 1)],
                       dtype=object)


def host_priorities_json(prefixes: np.ndarray, scores: np.ndarray) -> bytes:
    """HostPriorityList as JSON bytes from `host_prefix` fragments (object array) and integer scores 0..10:
    byte for byte what `dumps(host_priorities(...))` writes, in one join instead of thousands of dicts."""
    n = len(prefixes)
    if n == 0:
        return b"[]"
    parts = np.empty(2 * n + 2, dtype=object)
    parts[0] = b"["
    parts[1:-1:2] = prefixes
    parts[2:-1:2] = _SCORE_ITEM[scores]
    parts[-2] = _SCORE_LAST[scores[-1]]
    parts[-1] = b"]"
    return b"".join(parts.tolist())


def binding_result(error: str = "") -> dict[str, str]:
    return {"Error": error}


def preemption_result(victims: dict[str, tuple[list[str], int]]) -> dict[str, Any]:
    """ExtenderPreemptionResult, always the Meta (UID) form."""
    return {
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": pdb}
            for node, (uids, pdb) in victims.items()
        }
    }


def preemption_result_json(victims: dict[str, tuple[list[str], int]]) -> bytes:
    """`preemption_result` as JSON bytes, byte for byte what `dumps` writes of it, one node at a time: a call
    naming 10^5 victims is answered in a worker thread, and many short encoder calls let the event loop take
    the interpreter lock between them where one long call would hold it for a tenth of a second."""
    parts = [dumps(node) + b":" + dumps({"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": pdb})
             for node, (uids, pdb) in victims.items()]
    return b'{"NodeNameToMetaVictims":{' + b",".join(parts) + b"}}"
