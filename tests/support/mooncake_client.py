"""The speculators-side Mooncake client the server tests run in the client environment
(``client_python -c SCRIPT job.json``): speculators' request (its ``vllm_client``) and hs-connectors'
reader (what train's loader calls) against one or more servers sharing one store.

``job.json``: ``rows`` (token ids per row), ``endpoints`` (``http://host:port/v1``), ``out`` (a
directory: each sample read is saved there as ``hs_<row>.safetensors``), ``train_args``
(hs-connectors' train options: ``--mooncake-master`` and the segment sizes).  Row ``i`` goes to
endpoint ``i % len(endpoints)``; the script prints ``SPEC_COMPAT_RESULT <json>`` at the end.

The two scripts share their set-up (one text, :data:`_SETUP`); they differ in what a row does:
:data:`FETCH` sends every row once, 16 at a time, and reads and deletes each sample afterwards
(tests/server/test_mooncake.py); :data:`ROUND_TRIPS` retries a row's whole round trip (request, read)
up to 4 times, 4 rows at a time, and notes when each came back (a server or master killed mid-run:
tests/server/test_mooncake_restart.py, test_mooncake_master_killed.py).
"""

from __future__ import annotations

#: the client's set-up: hs-connectors' Mooncake transfer from ``train_args``, one OpenAI client per
#: endpoint (no retries of its own), the served model's name
_SETUP = r"""from concurrent.futures import ThreadPoolExecutor
import openai
from safetensors.torch import save_file
from hs_connectors.transfer import MooncakeBackend
from speculators.data_generation.vllm_client import generate_hidden_states
job = json.load(open(sys.argv[1]))
parser = argparse.ArgumentParser()
MooncakeBackend.add_train_args(parser)
transfer = MooncakeBackend.from_train_args(parser.parse_args(job["train_args"]), "")
transfer.setup()
clients = [openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0) for url in job["endpoints"]]
model = clients[0].models.list().data[0].id
"""

#: every row sent once (16 concurrent requests), then each sample read, saved and deleted; the result:
#: per row its handle, endpoint, extract mode and the answer's keys
FETCH = "\nimport argparse, json, sys\n" + _SETUP + r"""def one(i):
    return generate_hidden_states(clients[i % len(clients)], model, {"input_ids": job["rows"][i]}, timeout=300)
with ThreadPoolExecutor(16) as pool:
    answers = list(pool.map(one, range(len(job["rows"]))))
meta = []
for i, (handle, params) in enumerate(answers):
    sample = transfer.get_generated(params)
    save_file({k: v.contiguous() for k, v in sample.items()}, f"{job['out']}/hs_{i}.safetensors")
    transfer.delete(handle)
    meta.append({"handle": handle, "endpoint": i % len(clients), "mode": params["metadata"]["extract_mode"],
                 "keys": sorted(params)})
print("SPEC_COMPAT_RESULT " + json.dumps(meta))
"""

#: each row's round trip (request, read; saved, then deleted) retried up to 4 times, 4 rows at a time;
#: the result: per row its handle, endpoint, round trips and when it came back
ROUND_TRIPS = "\nimport argparse, json, sys, time\n" + _SETUP + r"""def one(i):
    attempts = 0
    for round_trip in range(4):
        attempts += 1
        try:
            handle, params = generate_hidden_states(clients[i % len(clients)], model, {"input_ids": job["rows"][i]},
                                                    timeout=60, max_retries=7)
            sample = transfer.get_generated(params)
        except Exception as exc:
            print(f"row {i}: round trip {round_trip} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            continue
        save_file({k: v.contiguous() for k, v in sample.items()}, f"{job['out']}/hs_{i}.safetensors")
        try:
            transfer.delete(handle)
        except Exception as exc:  # read already; a master that died since took it with it
            print(f"row {i}: delete failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return {"row": i, "handle": handle, "endpoint": i % len(clients), "round_trips": attempts, "at": time.time()}
    raise RuntimeError(f"row {i}: no sample after {attempts} round trips")
with ThreadPoolExecutor(4) as pool:
    done = list(pool.map(one, range(len(job["rows"]))))
print("SPEC_COMPAT_RESULT " + json.dumps(done))
"""
