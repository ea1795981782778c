"""Patches for speculators' trainer (speculators.train, the Eagle3 draft model)."""
