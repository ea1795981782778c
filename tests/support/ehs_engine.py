"""Run vLLM's ``extract_hidden_states`` method in an ``LLM()`` engine (default process model:
engine core and worker spawned, spec-compat loaded there through the plugin entry point).

usage: python ehs_engine.py SPEC.json   -> prints ``SPEC_COMPAT_RESULT {json}`` on stdout
(tests call :func:`run_engine`, which runs this file in a fresh interpreter)

SPEC: model, layer_ids, storage, engine (extra LLM kwargs), waves (a list of prompt lists: each
wave is one ``generate`` call, so a later wave can hit the prefix cache of an earlier one),
optional ``before`` {wave index: "break-storage" | "restore-storage"}: the storage directory is
replaced by a plain file (no write can succeed, not even root's), or made a directory again.
Result: per request (in submission order) its prompt ids, finished reason, cached tokens and
``kv_transfer_params``.  After each wave the harness reads as a lock-aware client does (vLLM 0.32's
protocol, which the backport's background writer follows): it waits on each named file's ``.lock``,
then removes it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

from lock_reader import contract_reader_wait  # tests/support (this file's directory)


def _storage(action: str, path: str) -> None:
    if action == "break-storage":
        shutil.rmtree(path)
        open(path, "w").close()
    elif action == "restore-storage":
        os.unlink(path)
        os.makedirs(path)
    else:
        raise ValueError(action)


def run_engine(spec: dict, tmp, disable: str | None = None, timeout: int = 600, **extra_env: str):
    """Run this file on ``spec`` (written under ``tmp``) with ``SPEC_COMPAT_DISABLE=disable``;
    returns (CompletedProcess, result list or None)."""
    import subprocess
    from pathlib import Path

    tmp = Path(tmp)
    path = tmp / f"spec-{len(list(tmp.glob('spec-*.json')))}.json"
    path.write_text(json.dumps(spec))
    env = dict(os.environ, **extra_env)
    env.pop("SPEC_COMPAT_DISABLE", None)
    if disable:
        env["SPEC_COMPAT_DISABLE"] = disable
    proc = subprocess.run([sys.executable, __file__, str(path)], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=str(tmp))
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("SPEC_COMPAT_RESULT "):
            result = json.loads(line.split(" ", 1)[1])
    return proc, result


def engine_settings(prefix: bool, chunked: bool, block: int = 16) -> dict:
    """LLM kwargs: fp32, small blocks, prefix caching / chunked prefill (budget 64) on or off."""
    return {"dtype": "float32", "block_size": block, "max_model_len": 512, "enable_prefix_caching": prefix,
            "enable_chunked_prefill": chunked, "max_num_batched_tokens": 64 if chunked else 512}


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    import spec_compat  # noqa: F401  (before vLLM, as users do)
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=spec["model"], seed=0,
        speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                            "draft_model_config": {"hf_config": {
                                "eagle_aux_hidden_state_layer_ids": spec["layer_ids"]}}},
        kv_transfer_config={"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                            "kv_connector_extra_config": {"shared_storage_path": spec["storage"]}},
        **spec.get("engine", {}),
    )
    params = SamplingParams(temperature=0, max_tokens=spec.get("max_tokens", 1))
    out = []
    for k, wave in enumerate(spec["waves"]):
        if str(k) in spec.get("before", {}):
            _storage(spec["before"][str(k)], spec["storage"])
        results = llm.generate([{"prompt_token_ids": ids} for ids in wave], params, use_tqdm=False)
        for r in results:
            path = (r.kv_transfer_params or {}).get("hidden_states_path")
            if path and os.path.exists(path + ".lock"):
                contract_reader_wait(path + ".lock", timeout=120.0, poll_interval=0.005)
            out.append({"prompt_token_ids": list(r.prompt_token_ids), "num_cached_tokens": r.num_cached_tokens,
                        "finish_reason": r.outputs[0].finish_reason,
                        "kv_transfer_params": r.kv_transfer_params})
    print("SPEC_COMPAT_RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
