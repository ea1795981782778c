"""Patches for speculators' hidden-state extraction through vLLM (generator, worker, platform)."""
