"""What the worker-side capture units share: speculators' ``HiddenStatesWorkerExtension`` inside
vLLM's spawned workers, reached through the ``vllm.general_plugins`` entry point.

Four patches stack on ``_setup_hidden_states_capture``; their order is declared (``after``):

* ``decoder-stack-locator`` (:mod:`.decoder_stack_locator`) replaces it: capture on the decoder stack
  of any wrapper (K2);
* ``capture-layer-hooks`` (:mod:`.capture_layer_hooks`) wraps it: forward hooks on the chosen layers,
  the model's own forward back in place (K3);
* ``capture-per-request`` (:mod:`.capture_per_request`) wraps it and the store/reset/collect methods:
  rows keyed by request id (F10);
* ``capture-handoff-shm`` (:mod:`.capture_handoff_shm`) wraps those: rows into /dev/shm segments, the
  reply a descriptor.

Each unit's function takes the method(s) it wraps and returns the replacement(s); the patches put
them in place through their undo log.
"""

from __future__ import annotations

#: speculators' worker extension module (loaded in vLLM's workers)
CUSTOM_WORKER = "speculators.data_generation.custom_worker"

#: the extension's methods that capture-per-request replaces (and capture-handoff-shm wraps)
CAPTURE_METHODS = ("_setup_hidden_states_capture", "_store_captured_states", "_reset_capture", "_get_captured_states")
