"""Read-only checks of every patch in the global REGISTRY (never applied here)."""

from __future__ import annotations

import inspect
import re

import pytest

from spec_compat import REGISTRY
from spec_compat.core import versions as _versions
from spec_compat.core.registry import Patch

KEBAB = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
TARGET = re.compile(rf"^{DOTTED}:[A-Za-z_]\w*$")
MAX_DOC_LINES = 6

PATCHES = REGISTRY.patches()


def test_registry_has_patches():
    assert len(PATCHES) >= 1
    ids = [p.id for p in PATCHES]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.id)
def test_patch_declaration(patch: Patch):
    cls = type(patch)
    assert KEBAB.match(patch.id), patch.id
    for attr in ("summary", "upstream"):
        value = getattr(patch, attr)
        assert isinstance(value, str) and value.strip(), attr
    assert TARGET.match(patch.target), patch.target
    assert patch.target_module and patch.target_attr
    assert patch.side in {"driver", "worker", "platform", "server", "engine"}
    assert isinstance(patch.fixes, tuple)

    doc = cls.__doc__
    assert doc and doc is not Patch.__doc__, f"{patch.id} has no docstring of its own"
    lines = [ln for ln in inspect.cleandoc(doc).splitlines()]
    assert 1 <= len(lines) <= MAX_DOC_LINES, f"{patch.id}: docstring has {len(lines)} lines"

    assert patch.alternatives() and all(patch.alternatives()), f"{patch.id} declares no version range"
    for combo in patch.alternatives():
        for dist, spec in combo.items():
            # a tracked distribution, the package the patch itself targets, or hs-connectors (whose
            # connectors vLLM loads: a vLLM-side patch can be needed only where they are installed)
            own = patch.target_module.split(".")[0].replace("_", "-")
            assert dist in _versions.TRACKED or dist in (own, "hs-connectors"), dist
            specset = _versions.parse_spec(spec)
            assert str(specset), spec
            # the range is decidable for a plain release
            assert _versions.in_range("0.0.1", spec) in (True, False)


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.id)
def test_patch_needed_is_decidable_for_any_versions(patch: Patch):
    none_installed = {d: None for c in patch.alternatives() for d in c}
    needed, why = patch.needed(none_installed)
    assert needed is False and "not installed" in why
