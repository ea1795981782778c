"""The modules of speculators' EAGLE-3 trainer (and transformers' AutoConfig) that the
training patches target, and the speculators releases those patches are written for."""

from __future__ import annotations

CORE = "speculators.models.eagle3.core"
ATTENTION = "speculators.models.eagle3.attention"
TRAINER = "speculators.train.trainer"
UTILS = "speculators.train.utils"
CHECKPOINTER = "speculators.train.checkpointer"
AUTO_CONFIG = "transformers.models.auto.configuration_auto"
DRAFT = "Eagle3DraftModel"

SPEC_TRAIN = ">=0.3,<0.5"
