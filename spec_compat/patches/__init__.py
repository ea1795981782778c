"""Registered patches, grouped by what they fix.  Importing this package registers every patch:
each module of these folders is found and imported (no list to keep by hand); a module declares its
patches with ``@register``.  No target is imported here (targets are reached lazily through
post-import hooks).

* ``extraction/`` - speculators' hidden-state extraction through vLLM: its generator (0.3.x and
  0.4.x lines), the worker extension, the CPU platform, Kimi-K2.5 loading, preprocessing
* ``training/``   - speculators' trainer: verifier config, CPU-only machines, layer convention
  and precision as served, draft reload, transformers 5
* ``serving/``    - the trained draft served by vLLM as EAGLE-3 speculator: CPU speculative
  decoding, DeepSeek-V3 / Kimi-K2.5 backbones
* ``hidden_states/`` - vLLM's hidden-states extraction API (speculators >= 0.5's server path)
  on vLLM 0.15/0.16
* ``native_cpu/`` - vLLM's own extraction API (>= 0.17) on the PyPI CPU build, without a GPU

Registration order (``PATCH_IDS``, the order of ``report``, the tie-break of the installation
order, which follows each patch's ``after``) is the modules' dotted names sorted, then the order
of the declarations within a module.  Modules whose name starts with ``_`` and ``ranges`` hold
shared helpers and are imported by the patches that use them.
"""

from __future__ import annotations

import importlib
import pkgutil

#: modules of this package that declare no patch (shared helpers, imported where used)
HELPERS = ("ranges",)


def _discover() -> tuple[str, ...]:
    """Import every unit under this package, in sorted order; their dotted names.  A unit is a module
    of a group folder (``patches/<group>/<unit>.py``) or a folder of its own there
    (``patches/<group>/<unit>/__init__.py`` declares, its other modules hold the behaviour)."""
    found = []
    # group by group, not pkgutil.walk_packages: that imports each package it lists (a folder unit
    # would register while the walk goes on, ahead of the sorted order)
    for group in pkgutil.iter_modules(__path__, f"{__name__}."):
        if not group.ispkg or group.name.rsplit(".", 1)[-1].startswith("_"):
            continue
        for info in pkgutil.iter_modules(importlib.import_module(group.name).__path__, f"{group.name}."):
            leaf = info.name.rsplit(".", 1)[-1]
            if not (leaf.startswith("_") or leaf in HELPERS):
                found.append(info.name)
    for name in sorted(found):
        importlib.import_module(name)
    return tuple(sorted(found))


MODULES = _discover()
