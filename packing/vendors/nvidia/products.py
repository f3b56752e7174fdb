"""NVIDIA's product strings: GPU Feature Discovery's `nvidia.com/gpu.product` values (`NVIDIA-A100-SXM4-80GB`,
`Tesla-T4`), which carry `-MIG-<profile>` under MIG strategy single and `-SHARED` when the device plugin replicates
the GPUs without renaming them. The catalog matches the part before the suffixes to a model, leaving out the words
that name no model: the brand and the Tesla line (`Tesla-T4` is the catalog's `T4`)."""

from __future__ import annotations

from collections.abc import Iterator

from packing.catalog import Catalog, ProductInfo

_SHARED = "-SHARED"
_MIG = "-MIG-"
BRAND_WORDS = frozenset({"NVIDIA", "TESLA"})


def resolve_product(catalog: Catalog, product: str) -> ProductInfo:
    """Take a GFD product string apart: `<base>[-MIG-<profile>][-SHARED]`."""
    raw = product
    s = product.strip()
    shared = False
    suffix: str | None = None
    if s.upper().endswith(_SHARED):
        s, shared = s[: -len(_SHARED)], True
    i = s.upper().rfind(_MIG)
    if i >= 0:
        s, suffix = s[:i], s[i + len(_MIG):]
        if suffix.upper().endswith(_SHARED):  # tolerate either suffix order
            suffix, shared = suffix[: -len(_SHARED)], True
    model = catalog.match_model(s, ignore=BRAND_WORDS)
    mig_profile: str | None = None
    invalid = False
    if suffix is not None:
        if suffix.upper() == "INVALID":
            invalid = True
        else:
            prof = model.mig.profile(suffix) if model is not None and model.mig is not None else None
            mig_profile = prof.name if prof is not None else suffix
    return ProductInfo(raw=raw, base=s, model=model, shared=shared, mig_profile=mig_profile, mig_invalid=invalid)


def product_forms(product: str) -> Iterator[str]:
    """The names a GPU of this GFD product answers to (as `packing.usage.gpu_model_allowed` reads them)."""
    if not product:
        return
    yield product
    if product.lower().endswith(_SHARED.lower()):
        yield product[: -len(_SHARED)]
    i = product.lower().find(_MIG.lower())
    if i > 0:
        yield product[:i]
