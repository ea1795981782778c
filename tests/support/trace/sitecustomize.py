"""Proof-input tracer: loaded by every Python process a proof run starts (``PYTHONPATH`` holds this
directory while a proof test runs; see ``tests/support/proof_keys.py``).

With ``PROOF_TRACE_DIR`` and ``PROOF_TRACE_ROOT`` set, the process appends to
``PROOF_TRACE_DIR/<pid>.trace``: one JSON line with its environment (``sys.prefix``) and the
installed versions of the distributions keys name, then one line per file under the root that it
imports (its main script too), written as the import happens -- a worker that is killed still leaves
what it loaded.  Nothing else changes: the finder only watches the other finders' answers.
"""

from __future__ import annotations

import os
import sys


def install(out_dir: str, root: str, dists: list[str]):
    """Start tracing this process into ``out_dir``; returns a function that stops it (None when
    the trace file cannot be opened)."""
    import json
    from importlib.metadata import PackageNotFoundError, version

    root = os.path.join(os.path.realpath(root), "")
    path = os.path.join(out_dir, f"{os.getpid()}.trace")
    try:
        fh = open(path, "a", buffering=1)
    except OSError:
        return None

    def dist(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    fh.write(json.dumps({"prefix": os.path.realpath(sys.prefix),
                         "versions": {n: dist(n) for n in dists if n}}) + "\n")
    seen: set[str] = set()

    def note(origin: str | None) -> None:
        if origin and origin not in seen:
            real = os.path.realpath(origin)
            seen.add(origin)
            if real.startswith(root):
                fh.write(real[len(root):] + "\n")

    if sys.argv and sys.argv[0] not in ("", "-c", "-m"):
        note(sys.argv[0])

    class ProofInputTracer:
        """A meta-path finder that asks the finders after it and notes what they found."""

        @classmethod
        def find_spec(cls, name, path=None, target=None):
            for finder in sys.meta_path:
                if finder is cls:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    note(spec.origin)
                    return spec
            return None

    sys.meta_path.insert(0, ProofInputTracer)

    def stop() -> None:
        if ProofInputTracer in sys.meta_path:
            sys.meta_path.remove(ProofInputTracer)
        fh.close()

    return stop


if os.environ.get("PROOF_TRACE_DIR") and os.environ.get("PROOF_TRACE_ROOT"):
    install(os.environ["PROOF_TRACE_DIR"], os.environ["PROOF_TRACE_ROOT"],
            os.environ.get("PROOF_TRACE_DISTS", "").split(","))
