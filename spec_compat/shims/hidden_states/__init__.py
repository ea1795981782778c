"""Building blocks of the ``extract_hidden_states`` backport (vLLM 0.15/0.16): layer-id checks
(:mod:`.layer_ids`), slot arithmetic and row gathering from a block-paged cache (:mod:`.slots`),
the file protocol - atomic safetensors writes, ``.lock`` and ``.error`` companions
(:mod:`.files`), the names of the API (:mod:`.contract`), the per-slot row store and its capture
hooks (:mod:`.store`) and the KV connector vLLM loads (:mod:`.connector`, the only module here
that imports vLLM; not imported by this package).  Design: docs/design/extract-hidden-states.md.

Nothing imported here imports torch, safetensors or vllm at import time, nor spec_compat.core or
spec_compat.patches.
"""

from .files import (
    HiddenStatesWriteError, acquire_lock, error_path, final_path, hidden_states_tensors, lock_path, release_lock,
    temp_path, write_atomically,
)
from .layer_ids import LAYER_ID_CONVENTION, LayerIdError, check_layer_ids
from .slots import blocks_needed, gather_rows, token_slots

__all__ = [
    "HiddenStatesWriteError", "LAYER_ID_CONVENTION", "LayerIdError", "acquire_lock", "blocks_needed",
    "check_layer_ids", "error_path", "final_path", "gather_rows", "hidden_states_tensors", "lock_path",
    "release_lock", "temp_path", "token_slots", "write_atomically",
]
