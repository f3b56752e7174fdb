"""Whether a name a pod writes in `vramfit.io/gpu-models` can ever match a GPU.

A pod's model list is matched against each GPU's catalog model name and its product string
(`packing.usage.gpu_model_allowed`). A name that is neither is not an error anywhere in Kubernetes: the pod
simply never fits and waits forever. So the webhook, the what-if and the filter ask this one rule, and name
the closest known names.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable

from packing.catalog import Catalog
from packing.vendors import gpu_names, product_model


def known_model(catalog: Catalog, name: str) -> bool:
    """A catalog model (any case) or a product string (no spaces) a vendor resolves to a catalog model."""
    name = name.strip()
    if not name:
        return False
    if catalog.get(name) is not None:
        return True
    return not any(c.isspace() for c in name) and product_model(catalog, name) is not None


def _suggestions(catalog: Catalog, name: str, seen: Iterable[str]) -> list[str]:
    by_lower: dict[str, str] = {}
    for model in catalog.models.values():
        for known in (model.name, *model.products):
            by_lower.setdefault(known.lower(), known)
    for product in seen:
        by_lower.setdefault(product.lower(), product)
    key = name.strip().lower()
    # "A100" means one of the A100 models more likely than the A10 that difflib finds closest.
    starting = sorted(m.name for m in catalog.models.values() if m.name.lower().startswith(key + "-"))
    close = difflib.get_close_matches(key, list(by_lower), n=3, cutoff=0.6)
    return list(dict.fromkeys([*starting, *(by_lower[c] for c in close)]))[:4]


def unknown_models_problem(catalog: Catalog, names: Iterable[str],
                           seen: Callable[[], Iterable[str]] = lambda: ()) -> str | None:
    """None when every name can match a GPU, else one line naming the first that cannot and the closest known
    names. `seen` gives the products of the GPUs the cluster has now (an uncatalogued GPU is named by its
    product); it is only called when the catalog alone does not know a name."""
    seen_now: set[str] | None = None
    for name in names:
        if known_model(catalog, name):
            continue
        if seen_now is None:
            # The names, lower case, the cluster's GPUs answer to under any vendor's reading of their product.
            seen_now = {form for product in seen() for form in gpu_names(None, product)}
        if name.strip().lower() in seen_now:
            continue
        close = _suggestions(catalog, name, seen_now)
        hint = (f"did you mean {' or '.join(repr(c) for c in close)}?" if close
                else f"catalog models: {', '.join(sorted(catalog.models))}")
        return (f"{name.strip()!r} is neither a GPU model of the catalog nor a GPU product it knows, so no GPU "
                f"would ever match and the pod would wait forever ({hint}; a GPU the catalog lacks goes in the "
                f"catalog override file, config key catalog_path)")
    return None
