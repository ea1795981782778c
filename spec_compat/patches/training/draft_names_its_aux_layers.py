"""O6: speculators' EAGLE-3 trainer saves a draft config that names its aux layers in vLLM's
convention."""

from __future__ import annotations

import logging
from types import ModuleType
from typing import Any

from ...core.proof import Proof
from ...core.registry import Changes, Patch, register
from .. import _guards as guard
from ._targets import SPEC_TRAIN, TRAINER

log = logging.getLogger("spec_compat")


@register
class DraftNamesItsAuxLayers(Patch):
    """speculators (0.3.0-0.4.x) extracts the OUTPUT of each listed layer; vLLM's EAGLE-3 path
    feeds the draft the INPUT of each ``eagle_aux_hidden_state_layer_ids`` entry, or of its
    default (2, n//2, n-3) when the draft config has none: served features are off by one
    layer.  Before saving, the draft config gets ``[l + 1 for l in feature layers]``, read
    from speculators' own ``data_config.json`` next to the training files."""

    id = "draft-names-its-aux-layers"
    proof = Proof("wrong-values", "tests/engine/test_training.py::test_draft_names_no_aux_layers_without_shim", r"eagle_aux_hidden_state_layer_ids: None")
    fixes = ("O6",)
    summary = ("the saved draft config names the layers it was trained on in vLLM's convention: "
               "eagle_aux_hidden_state_layer_ids = captured feature layers + 1 (from the training data's "
               "data_config.json); an explicit value is kept")
    upstream = ("speculators 0.3.0-0.4.x custom_worker captures layer outputs; vLLM gpu_model_runner reads "
                "eagle_aux_hidden_state_layer_ids as layer inputs (default 2, n//2, n-3)")
    target = f"{TRAINER}:Trainer"
    requires = {"speculators": SPEC_TRAIN}

    def check(self, module: ModuleType) -> None:
        cls = guard.attr(module, "Trainer")
        guard.has_params(cls.save_checkpoint, "Trainer.save_checkpoint", "self", "epoch")
        guard.has_params(cls.__init__, "Trainer.__init__", "model", "config", "train_loader")

    def install(self, module: ModuleType, changes: Changes) -> None:
        from ...shims.verifier import aux_layer_ids_for_vllm, captured_layer_ids, data_config_for

        def save_checkpoint(wrapped: Any, trainer: Any, args: tuple, kwargs: dict) -> Any:
            config = getattr(getattr(trainer, "model", None), "config", None)
            if config is not None and getattr(config, "eagle_aux_hidden_state_layer_ids", None) is None:
                files = getattr(getattr(trainer.train_loader, "dataset", None), "data", None) or []
                data_config = data_config_for(files[:8])
                captured = captured_layer_ids(data_config) if data_config else None
                if captured is None:
                    log.warning("spec_compat: %s: no data_config.json with layer_ids next to the training data: "
                                "the draft config names no aux layers and vLLM will use its defaults",
                                DraftNamesItsAuxLayers.id)
                else:
                    ids = aux_layer_ids_for_vllm(captured, DraftNamesItsAuxLayers.id)
                    config.eagle_aux_hidden_state_layer_ids = ids
                    log.info("spec_compat: %s: captured layer outputs %s -> eagle_aux_hidden_state_layer_ids %s",
                             DraftNamesItsAuxLayers.id, captured[:-1], ids)
            return wrapped(*args, **kwargs)

        changes.wrap(module.Trainer, "save_checkpoint", save_checkpoint)
