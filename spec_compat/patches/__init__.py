"""Registered patches, grouped by what they fix.  Importing this package registers every patch;
it imports no target (targets are reached lazily through post-import hooks).

* ``extraction/`` - speculators' hidden-state extraction through vLLM: its generator (0.3.x and
  0.4.x lines), the worker extension, the CPU platform, Kimi-K2.5 loading, preprocessing
* ``training/``   - speculators' trainer: verifier config, CPU-only machines, layer convention
  and precision as served, draft reload, transformers 5
* ``serving/``    - the trained draft served by vLLM as EAGLE-3 speculator: CPU speculative
  decoding, DeepSeek-V3 / Kimi-K2.5 backbones
* ``hidden_states/`` - vLLM's hidden-states extraction API (speculators >= 0.5's server path)
  on vLLM 0.15/0.16
* ``native_cpu/`` - vLLM's own extraction API (>= 0.17) on the PyPI CPU build, without a GPU

The import order below is the registration order (``PATCH_IDS``, the order of ``report``).
"""

from .extraction import generator_spec03, generator_driver_wait, generator_tokenizer  # noqa: F401
from .extraction import generator_spec04, generator_checks_threads  # noqa: F401
from .extraction import cpu_platform, worker, kimi_k25, preprocessing  # noqa: F401
from .training import verifier, without_cuda, as_served, precision, draft_reload  # noqa: F401
from .training import transformers5, spec09_cpu, fused_loss  # noqa: F401
from .serving import cpu_spec_decode, eagle3_deepseek, eagle3_norms  # noqa: F401
from .hidden_states import config, capture, http_errors, render, connector_module  # noqa: F401
from .hidden_states import cache_group, host_streams  # noqa: F401
from .native_cpu import dist_alias, connector_host_copy  # noqa: F401
from .extraction import kimi_tokenizer, offline_checks  # noqa: F401
from .hidden_states import transfer_checks, master_check  # noqa: F401
from .serving import published_heads, head_convert  # noqa: F401
from .hidden_states import mooncake_answer  # noqa: F401
from .hidden_states import offline_store  # noqa: F401
