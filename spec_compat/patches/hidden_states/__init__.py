"""vLLM's hidden-states extraction API (``--speculative-config '{"method":
"extract_hidden_states", ...}'`` + ``ExampleHiddenStatesConnector``, native from vLLM 0.17)
on vLLM 0.15/0.16, for speculators >= 0.5.  Design: docs/design/extract-hidden-states.md."""

#: where the backport is needed: the vLLM releases without the method
VLLM_WITHOUT_EHS = ">=0.15,<0.17"
