"""What the commands check about a checkpoint directory the user names, before anything of it is
imported: that it is one, that it is an EAGLE-3 draft where a draft is asked for, that transformers
knows its configuration class, and that its own Python (``auto_map``) runs only with the user's
``--trust-remote-code``, as vLLM and transformers require.

Shared by ``selftest``, ``evaluate`` (one draft: evaluate.py, several: compare_drafts.py) and the
demo's steps; nothing here imports transformers at module level.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

#: the option every command that loads a user's checkpoint takes
TRUST_FLAG = "--trust-remote-code"
TRUST_HELP = ("run the Python a checkpoint ships (its config.json's auto_map) when loading it; without it such a "
              "checkpoint is refused before any of its files is imported (the fixtures spec-compat writes itself "
              "are trusted by the command that wrote them)")


class CheckpointError(ValueError):
    """A checkpoint directory the user named cannot be used as given (the commands exit 2)."""


class RemoteCodeRefused(CheckpointError):
    """The checkpoint ships its own Python and the user did not pass ``--trust-remote-code``."""


def model_dir(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` as a checkpoint directory (one with a config.json), or :class:`CheckpointError`."""
    p = Path(path)
    if not p.is_dir():
        raise CheckpointError(f"{what} {str(p)!r} is not a directory")
    if not (p / "config.json").is_file():
        raise CheckpointError(f"{what} {str(p)!r} has no config.json (not a checkpoint directory)")
    return p


def config_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{what} {str(path)!r}: config.json is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{what} {str(path)!r}: config.json holds no object")
    return data


def eagle3_draft(draft: Path) -> None:
    """An EAGLE-3 draft: speculators' format (``speculators_model_type: eagle3``) or a native
    vLLM/HF one (an ``Eagle3`` architecture)."""
    cfg = config_json(draft, "draft")
    archs = cfg.get("architectures") or []
    if cfg.get("speculators_model_type") != "eagle3" and not any("eagle3" in str(a).lower() for a in archs):
        raise CheckpointError(f"draft {str(draft)!r} is not an EAGLE-3 draft (speculators_model_type "
                              f"{cfg.get('speculators_model_type')!r}, architectures {archs})")


def remote_code_modules(path: Path) -> list[str]:
    """The modules the checkpoint's own files name for transformers to import (``auto_map`` of
    config.json and tokenizer_config.json), sorted; empty where it ships none."""
    found: set[str] = set()
    for name in ("config.json", "tokenizer_config.json", "processor_config.json", "preprocessor_config.json"):
        try:
            data = json.loads((path / name).read_text())
        except (OSError, ValueError):
            continue
        auto_map = data.get("auto_map") if isinstance(data, dict) else None
        for ref in (auto_map or {}).values() if isinstance(auto_map, dict) else ():
            for one in ref if isinstance(ref, list) else [ref]:
                if isinstance(one, str) and "." in one:
                    found.add(one.split("--")[-1].rsplit(".", 1)[0])
    return sorted(found)


def consent(path: Path, what: str, trust: bool) -> bool:
    """The ``trust_remote_code`` to load ``path`` with: True where it ships code and the user trusts it,
    False where it ships none; :class:`RemoteCodeRefused` (one line: the checkpoint, the module, the
    flag) where it ships code the user did not trust.  Nothing of the checkpoint is imported here."""
    modules = remote_code_modules(path)
    if modules and not trust:
        raise RemoteCodeRefused(f"{what} {str(path)!r} ships its own code (auto_map names "
                                f"{', '.join(m + '.py' for m in modules)}): pass {TRUST_FLAG} to run it")
    return bool(modules)


def known_config(path: Path, what: str, trust: bool) -> None:
    """A ``model_type`` transformers has no configuration class for, and no trusted ``auto_map``
    class: one line naming the checkpoint and the type (not transformers' list of every class)."""
    cfg = config_json(path, what)
    model_type = cfg.get("model_type")
    if trust and remote_code_modules(path):
        return
    from transformers import CONFIG_MAPPING

    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        import transformers

        raise CheckpointError(f"{what} {str(path)!r}: model_type {model_type!r} is not a configuration transformers "
                              f"{transformers.__version__} knows")


def checked_target(path: str | os.PathLike[str], what: str, trust: bool) -> tuple[Path, bool]:
    """A target checkpoint the user named, checked (directory, remote-code consent, known
    configuration): its path and the ``trust_remote_code`` to load it with."""
    p = model_dir(path, what)
    allowed = consent(p, what, trust)
    known_config(p, what, allowed)
    return p, allowed


def load_config(path: Path, trust: bool) -> Any:
    """transformers' config of a checked checkpoint (:func:`checked_target`)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(path), trust_remote_code=trust)


def text_config(path: Path, trust: bool) -> Any:
    """The text model's config (a multimodal wrapper's ``text_config``)."""
    from ..shims.verifier import text_config as inner

    return inner(load_config(path, trust))
