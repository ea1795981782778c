"""Version ranges that several patches declare (one definition each)."""

#: the speculators 0.3.x line (``VllmHiddenStatesGenerator`` with its own scheduler loop)
SPEC_03 = ">=0.3,<0.4"
#: the speculators 0.4.x line
SPEC_04 = ">=0.4,<0.5"
