"""Patches for serving the trained draft in vLLM as EAGLE-3 speculator."""
