"""Registered patches.  Importing this package registers every patch; it imports
no target (targets are reached lazily through post-import hooks)."""

from . import generator, platform, worker  # noqa: F401
from . import kimi  # noqa: F401  (after worker)
from . import preprocessing, training  # noqa: F401
from . import transformers5  # noqa: F401
from . import serving  # noqa: F401
