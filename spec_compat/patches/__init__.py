"""Registered patches.  Importing this package registers every patch; it imports
no target (targets are reached lazily through post-import hooks)."""

from . import generator_spec03, generator_driver_wait, generator_tokenizer  # noqa: F401  (in this order: PATCH_IDS)
from . import generator_spec04, generator_checks_threads  # noqa: F401
from . import platform, worker  # noqa: F401
from . import kimi  # noqa: F401  (after worker)
from . import preprocessing  # noqa: F401
from . import training_verifier, training_without_cuda, training_as_served  # noqa: F401  (in this order: PATCH_IDS)
from . import training_precision, training_draft_reload  # noqa: F401
from . import transformers5  # noqa: F401
from . import cpu_spec_decode, eagle3_deepseek  # noqa: F401  (in this order: PATCH_IDS)
