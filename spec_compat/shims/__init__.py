"""Version-adaptive adapters, each usable (and testable) on its own.

Shims hold the behaviour; :mod:`spec_compat.patches` decides where and when a
shim is installed.  Nothing here is imported by ``import spec_compat``.
"""
