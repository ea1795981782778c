"""Building blocks of the ``extract_hidden_states`` backport (vLLM 0.15/0.16) that several of its
patches share: the file protocol - atomic safetensors writes, ``.lock`` and ``.error`` companions
(:mod:`.files`), the names of the API (:mod:`.contract`), the background writer (:mod:`.writer`,
:mod:`.upstream_writer`),
the HTTP answers of failed writes (:mod:`.http_errors`), vLLM 0.17's hidden-states cache group
(:mod:`.cache_group`) and the Mooncake store (:mod:`.mooncake_master`, :mod:`.offline_store`).
What one patch alone uses lives in its unit: the layer-id checks and the KV connector vLLM loads
in ``patches/hidden_states/ehs_config/``; the slot arithmetic, the per-slot row store and its
capture hooks in ``patches/hidden_states/ehs_capture.py``.
Design: docs/design/extract-hidden-states.md.

Nothing imported here imports torch, safetensors or vllm at import time, nor spec_compat.core or
spec_compat.patches.
"""

from .files import (
    HiddenStatesWriteError, acquire_lock, error_path, final_path, hidden_states_tensors, lock_path, release_lock,
    temp_path, write_atomically,
)

__all__ = [
    "HiddenStatesWriteError", "acquire_lock", "error_path", "final_path", "hidden_states_tensors", "lock_path",
    "release_lock", "temp_path", "write_atomically",
]
