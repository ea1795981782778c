"""Names of vLLM's hidden-states extraction API that the backport answers to (vLLM >= 0.17
spells them the same), and the key under which the engine's settings travel."""

#: ``--speculative-config`` method
METHOD = "extract_hidden_states"
#: ``--kv-transfer-config`` connector name (speculators' launch command asks for it)
CONNECTOR_NAME = "ExampleHiddenStatesConnector"
#: ``kv_connector_extra_config`` key filled in by the patch ehs-config: layer_ids (ascending),
#: num_hidden_layers, hidden_size, storage (absolute directory)
SETTINGS_KEY = "spec_compat.extract_hidden_states"
#: the key of the answer's ``kv_transfer_params`` naming the file
PATH_KEY = "hidden_states_path"
