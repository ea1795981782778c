"""A proof's symptom is matched against the error that ended the stock run, not anywhere in its log
(``tests/support/proof_runs.py``: ``final_error``, ``first_error``, ``ProofRun.assert_symptom``).

The logs here are built from real Python tracebacks (``traceback.format_exception`` of raised
exceptions) with the prefixes vLLM's processes and loggers put on each line, torch.distributed's
``[rankN]: ``, and a rich (typer) traceback as ``speculators train`` prints it.
"""

from __future__ import annotations

import re
import textwrap
import traceback

import pytest

from spec_compat import REGISTRY
from spec_compat import patches  # noqa: F401  (registers every patch)
from spec_compat.core.proof import SYMPTOM_KINDS, Proof
from proof_runs import ProofRun, final_error, find_symptom, first_error, tracebacks  # tests/support

NO_DRIVER = ("Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a "
             "driver from http://www.nvidia.com/Download/index.aspx")


def _raise(exc: BaseException) -> None:
    raise exc


def _tb(fn, *args) -> str:
    """The traceback Python prints for ``fn(*args)`` raising (real frames, carets, chains, notes)."""
    try:
        fn(*args)
    except BaseException as exc:  # noqa: BLE001
        return "".join(traceback.format_exception(exc))
    raise AssertionError("did not raise")


def _no_driver() -> None:
    device = "cuda"
    _to(device)


def _to(device: str) -> None:
    raise RuntimeError(NO_DRIVER)


def _bad_value() -> None:
    raise ValueError("The repository /tmp/x contains custom code which must be executed to correctly load the model")


def _chained() -> None:
    try:
        _no_driver()
    except RuntimeError as exc:
        raise ValueError("could not build the draft") from exc


def _during_handling() -> None:
    try:
        _bad_value()
    except ValueError:
        _no_driver()


def _with_note() -> None:
    """vLLM's worker busy loop adds the formatted traceback as a note before logging the exception."""
    try:
        raise AttributeError("'LlamaModel' object has no attribute 'get_input_embeddings'")
    except AttributeError as e:
        e.add_note(traceback.format_exc())
        raise


def _tag(text: str, proc: str = "", log: str = "") -> str:
    """Each line as a vLLM process writes it: its process tag, then the log record's header."""
    pre = (f"({proc}) " if proc else "") + log
    return "".join(pre + line + "\n" for line in text.rstrip("\n").split("\n"))


ERR = "ERROR 12-05 10:00:02 [core.py:1006] "
WORKER_ERR = "ERROR 12-05 10:00:03 [multiproc_executor.py:863] "


def _run(symptom: str) -> ProofRun:
    return ProofRun("p", Proof("fails", "tests/x.py::test_y", symptom))


# -- the final exception of the last traceback -------------------------------------------------

def test_final_error_is_the_last_exception_with_its_frames():
    out = "starting\n" + _tb(_bad_value) + "retrying\n" + _tb(_no_driver) + "\n"
    err = final_error(out)
    assert err.startswith("Traceback (most recent call last):\n") and err.endswith(f"RuntimeError: {NO_DRIVER}\n")
    assert "in _no_driver\n" in err and "in _to\n" in err and "ValueError" not in err
    assert [tb.exception[0].split(":")[0] for tb in tracebacks(out)] == ["ValueError", "RuntimeError"]


def test_a_chain_ends_with_its_last_exception():
    out = _tb(_chained)
    assert "The above exception was the direct cause" in out and "RuntimeError: Found no NVIDIA" in out
    err = final_error(out)
    assert err.endswith("ValueError: could not build the draft\n") and NO_DRIVER not in err
    # the cause's frames are not the final exception's: a symptom naming them does not match
    assert find_symptom(Proof("fails", "tests/x.py::test_y", r"in _to\n(?:  .*\n)*RuntimeError: Found no"), out) is None
    handled = _tb(_during_handling)
    assert "During handling of the above exception" in handled
    assert final_error(handled).endswith(f"RuntimeError: {NO_DRIVER}\n")
    assert _run(r"in _to\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system").assert_symptom(handled) \
        == f"  File \"{__file__}\", line {_to.__code__.co_firstlineno + 1}, in _to\n    raise RuntimeError(NO_DRIVER)\n" \
           f"RuntimeError: {NO_DRIVER}"


def test_a_multi_line_message_is_the_exception_until_the_output_moves_on():
    msg = ("1 validation error for SpeculativeConfig\nmethod\n  Input should be 'ngram' or 'eagle3' "
           "[type=literal_error, input_value='extract_hidden_states', input_type=str]\n"
           "    For further information visit https://errors.pydantic.dev/2.14/v/literal_error")
    out = _tb(_raise, ValueError(msg)) + "/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: x\n"
    err = final_error(out)
    assert err.endswith("v/literal_error\n") and "UserWarning" not in err
    assert _run(r"ValueError: 1 validation error for SpeculativeConfig\nmethod\n  Input should be [^\n]*"
                r"\[type=literal_error, input_value='extract_hidden_states'").assert_symptom(out)


def test_no_traceback_no_final_error_a_verdict_is_passed_as_a_report():
    out = "PASS engine-start: 3.0s\nFAIL short: TypeError: got no block_size\nselftest: FAILED (1 failed)\n"
    assert final_error(out) is None and tracebacks(out) == []
    run = _run(r"TypeError: .*block_size")
    with pytest.raises(AssertionError, match="no traceback in the run's output"):
        run.assert_symptom(out)
    assert run.assert_symptom("FAIL short: TypeError: got no block_size", report=True) == \
        "FAIL short: TypeError: got no block_size"
    with pytest.raises(ValueError):
        run.assert_symptom(out, report=True, since=0)


def test_exception_ignored_reports_ended_nothing():
    out = _tb(_no_driver) + "Exception ignored in: <function Executor.__del__ at 0x7f>\n" + _tb(_bad_value)
    assert len(tracebacks(out)) == 2 and tracebacks(out)[1].ignored
    assert final_error(out).endswith(f"RuntimeError: {NO_DRIVER}\n")


# -- an unrelated crash with the same words elsewhere in the log no longer counts ----------------

def test_the_same_words_elsewhere_in_the_log_do_not_count():
    symptom = r"RuntimeError: Found no NVIDIA driver on your system"
    log = (_tag(f"probing CUDA: RuntimeError: {NO_DRIVER}", "EngineCore_DP0 pid=123", "WARNING 12-05 10:00:01 [cuda.py:80] ")
           + _tag("retrying on the CPU after:", "EngineCore_DP0 pid=123", ERR)
           + _tag(_tb(_no_driver), "EngineCore_DP0 pid=123", ERR)  # handled: the engine went on
           + _tag("EngineCore failed to start.", "EngineCore_DP0 pid=123", ERR)
           + _tag(_tb(_bad_value), "EngineCore_DP0 pid=123", ERR)  # what it died of
           + _tb(_raise, RuntimeError("Engine core initialization failed. See root cause above. "
                                      "Failed core proc(s): {'EngineCore_DP0': 1}")))
    assert re.search(symptom, log)  # what matching anywhere in the log found
    run = _run(symptom)
    with pytest.raises(AssertionError, match="does not show the declared symptom"):
        run.assert_symptom(log)
    assert run.symptom_seen is None
    assert final_error(log).endswith("contains custom code which must be executed to correctly load the model\n")
    # the error it did end with is found through the main process's relay
    assert _run(r"ValueError: The repository \S+ contains custom code").assert_symptom(log)


def test_a_frame_in_another_traceback_does_not_join_the_final_exception():
    """A symptom naming a frame: the frame must be in the final exception's own traceback."""
    log = _tb(_chained) + "\n" + _tb(_raise, RuntimeError(NO_DRIVER))
    old = r"in _to\n(?:.*\n)*?RuntimeError: Found no NVIDIA driver on your system"  # the loose form
    new = r"in _to\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system"
    assert re.search(old, log) and re.search(new, log)  # both match somewhere in the log ...
    assert find_symptom(Proof("fails", "tests/x.py::test_y", new), log) is None  # ... not in the error it ended with


# -- vLLM's processes -----------------------------------------------------------------------------

def test_vllm_multi_process_log_engine_core_failure_relayed_by_the_main_process():
    """``LLM(...)`` / ``spec-compat evaluate``: EngineCore logs its failure (and multiprocessing prints
    it again), the main process raises 'See root cause above'; lines of the processes interleave."""
    core = _tb(_raise, AssertionError("spec decode is not supported."))
    main = _tb(_raise, RuntimeError("Engine core initialization failed. See root cause above. "
                                    "Failed core proc(s): {'EngineCore_DP0': 1}"))
    tagged = _tag(core, "EngineCore_DP0 pid=123").split("\n")
    lines = (_tag("INFO: unrelated AssertionError: spec decode is not supported. in a log line", "", "INFO 12-05 [x.py:1] ")
             + _tag("EngineCore failed to start.\n" + core, "EngineCore_DP0 pid=123", ERR)
             + "(EngineCore_DP0 pid=123) Process EngineCore_DP0:\n").split("\n")[:-1]
    main_lines = main.rstrip("\n").split("\n")
    mixed = lines + [x for pair in zip(tagged, main_lines) for x in pair] + tagged[len(main_lines):]
    log = "\n".join(mixed) + "\n"
    err = final_error(log)
    assert err.endswith("AssertionError: spec decode is not supported.\n"), err
    assert "(EngineCore_DP0" not in err and "ERROR 12-05" not in err
    assert _run(r"AssertionError: spec decode is not supported\.").assert_symptom(log) == \
        "AssertionError: spec decode is not supported."


def test_vllm_032_log_format_and_engine_dead_error():
    """vLLM 0.32 tags every log record with its process, the main process's too."""
    core = _tb(_no_driver)
    log = (_tag("Hidden-states write", "EngineCore pid=7", "INFO 12-05 10:00:00 [connector.py:300] ")
           + _tag("EngineCore encountered a fatal error.\n" + core, "EngineCore pid=7", "ERROR 12-05 10:00:01 [core.py:1512] ")
           + _tag("AsyncLLM output_handler failed.\n" + _tb(_raise, RuntimeError(
               "EngineCore encountered an issue. See stack trace (above) for the root cause.")),
               "APIServer pid=6", "ERROR 12-05 10:00:01 [async_llm.py:500] "))
    assert final_error(log).endswith(f"RuntimeError: {NO_DRIVER}\n")
    assert first_error(log) == final_error(log)


def test_selftest_worker_failure_relayed_by_the_driver():
    """``spec-compat selftest``: stdout holds vLLM's log (the worker's exception, with the traceback
    vLLM adds as a note) and the FAIL line; stderr the driver's traceback of the relayed error."""
    worker = _tb(_with_note)
    assert worker.count("Traceback (most recent call last):") == 2  # the note is a traceback too
    stdout = (_tag("WorkerProc hit an exception.\n" + worker, "Worker_TP0 pid=42", WORKER_ERR)
              + "FAIL short: RuntimeError: Worker failed with error ''LlamaModel' object has no attribute "
                "'get_input_embeddings'', please check the stack trace above for the root cause\n"
              + "selftest: FAILED (1 failed)\n")
    stderr = _tb(_raise, RuntimeError("Worker failed with error ''LlamaModel' object has no attribute "
                                      "'get_input_embeddings'', please check the stack trace above for the root cause"))
    err = final_error(stdout + stderr)
    assert err.endswith("AttributeError: 'LlamaModel' object has no attribute 'get_input_embeddings'\n"), err
    assert _run(r"AttributeError: 'LlamaModel' object has no attribute 'get_input_embeddings'").assert_symptom(
        stdout + stderr)


def _vllm_record(message: str, tag: str, head: str) -> str:
    """A log record as vLLM's ``NewLineFormatter`` writes it: ``msg.replace("\\n", "\\r\\n" + prefix)``,
    every line of a multi-line record repeats the record's prefix (vLLM 0.16: the process tag comes
    from its stream wrapper; 0.32: from the log format)."""
    prefix = f"({tag}) {head}"
    return prefix + message.rstrip("\n").replace("\n", "\r\n" + prefix) + "\n"


def test_log_records_as_vllm_writes_them():
    """The worker's exception as vLLM logs it (``\\r\\n`` line ends, the record's prefix on each line,
    the traceback it adds as a note), relayed by the driver; an earlier record with the same words."""
    log = (_vllm_record("AttributeError: 'LlamaModel' object has no attribute 'get_input_embeddings' (retrying)",
                        "Worker_TP0 pid=42", "WARNING 12-05 08:58:20 [x.py:5] ")
           + _vllm_record("WorkerProc hit an exception.\n" + _tb(_with_note), "Worker_TP0 pid=42", WORKER_ERR))
    relay = _tb(_raise, RuntimeError("Worker failed with error ''LlamaModel' object has no attribute "
                                     "'get_input_embeddings'', please check the stack trace above for the root cause"))
    err = final_error(log + "FAIL short: RuntimeError: Worker failed\n" + relay)
    assert err.endswith("AttributeError: 'LlamaModel' object has no attribute 'get_input_embeddings'\n"), err
    assert "in _with_note\n" in err and "ERROR" not in err and "\r" not in err
    with pytest.raises(AssertionError):  # the words of the earlier record do not count
        _run(r"get_input_embeddings' \(retrying\)").assert_symptom(log + relay)


def test_worker_start_failure_names_the_frame_that_raised():
    """A worker dies at start (``WorkerProc initialization failed ... See stack trace for root cause``):
    the error is the worker's, with its frames."""
    stdout = _tag("WorkerProc failed to start.\n" + _tb(_no_driver), "Worker pid=42", WORKER_ERR)
    stderr = (_tb(_raise, Exception("WorkerProc initialization failed due to an exception in a background "
                                    "process. See stack trace for root cause."))
              + "Exception ignored in: <function MultiprocExecutor.__del__>\n" + _tb(_bad_value))
    assert _run(r"_to\(device\)\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system").assert_symptom(
        stdout + stderr) == f"    _to(device)\n  File \"{__file__}\", line {_to.__code__.co_firstlineno + 1}, in _to\n" \
                            f"    raise RuntimeError(NO_DRIVER)\nRuntimeError: {NO_DRIVER}"


def _rank(text: str, n: int) -> str:
    """An uncaught exception as torch.distributed's excepthook prints it after init_process_group."""
    return "\n".join(f"[rank{n}]: {s}" if s else "" for s in text.split("\n"))


def test_torchrun_ranks_interleaved_and_child_failed_error():
    """torchrun: both ranks die (their lines interleave), the launcher raises ChildFailedError."""
    a, b = _rank(_tb(_no_driver), 0).split("\n"), _rank(_tb(_no_driver), 1).split("\n")
    mixed = "\n".join(x for pair in zip(a, b) for x in pair) + "\n"
    launcher = _tb(_raise, RuntimeError("\n=====\ntraining_steps.py FAILED\n-----\nRoot Cause (first observed failure):"))
    launcher = launcher.replace("RuntimeError:", "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:")
    out = (mixed + "W1205 10:00:05.000000 99 torch/distributed/elastic/multiprocessing/api.py:1010] Sending process "
           "21343 closing signal SIGTERM\n" + launcher)
    err = final_error(out)
    assert err.endswith(f"RuntimeError: {NO_DRIVER}\n") and "[rank" not in err
    assert _run(r"_to\(device\)\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system").assert_symptom(out)


def test_rich_traceback_reads_as_a_plain_one():
    """typer (``speculators train``) prints exceptions as a rich box: the frame's title and the line
    it ran count, the lines shown around it do not."""
    def title(text: str) -> list[str]:  # rich folds a frame's title at the box's width (a long word mid-word)
        return textwrap.wrap(text, 76, break_on_hyphens=False)

    def inside(*rows: str) -> list[str]:  # the box's lines, padded to its width
        return [f"│ {row:<76} │" for row in rows]

    trainer = "/root/.cache/spec-compat/envs/spec0.9.0/lib/python3.11/site-packages/speculators/train/trainer.py"
    cuda = "/root/.cache/spec-compat/envs/spec0.9.0/lib/python3.11/site-packages/torch/cuda/__init__.py"
    box = "\n".join([
        "╭───────────────────── Traceback (most recent call last) ─────────────────────╮",
        *inside(*title(f"{trainer}:348 in setup_model"), "",
             "  345 │   │   if self.is_distributed:",
             "  346 │   │   │   torch.accelerator.synchronize()",
             "  347 │   │   else:",
             "❱ 348 │   │   │   self.model.to(self.local_rank)  # type:",
             "      ignore[arg-type]",
             "  349", "",
             *title(f"{cuda}:424 in _lazy_init"), "",
             "❱  424 │   │   torch._C._cuda_init()",
             "   425 │   │   # Some of the queued calls may reentrantly call _lazy_init();"),
        "╰──────────────────────────────────────────────────────────────────────────────╯",
        "RuntimeError: Found no NVIDIA driver on your system. Please check that you have ",
        "an NVIDIA GPU and installed a driver from ",
        "http://www.nvidia.com/Download/index.aspx",
    ]) + "\n"
    assert len(title(f"{trainer}:348 in setup_model")) == 2 and len(title(f"{cuda}:424 in _lazy_init")) == 2
    err = final_error("INFO training\n" + box)
    assert err.split("\n")[1:5] == [f"  {trainer}:348 in setup_model",
                                     "    self.model.to(self.local_rank)  # type: ignore[arg-type]",
                                     f"  {cuda}:424 in _lazy_init",
                                     "    torch._C._cuda_init()"], err
    assert _run(r"self\.model\.to\(self\.local_rank\).*\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your "
                r"system").assert_symptom(box)
    # a context line shown around the frame is not a line the run went through
    with pytest.raises(AssertionError):
        _run(r"torch\.accelerator\.synchronize\(\).*\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver").assert_symptom(box)


# -- a server's log: the first error after the stock request ----------------------------------

def test_server_log_first_error_after_the_request():
    before = _tag(_tb(_no_driver), "APIServer pid=1", "ERROR 12-05 10:00:00 [api_server.py:10] ")  # at start, handled
    since = len(before)
    after = (_tag("POST /v1/completions 200", "APIServer pid=1", "INFO 12-05 10:00:01 [h11.py:1] ")
             + _tag("EngineCore encountered a fatal error.\n" + _tb(_bad_value), "EngineCore pid=2", ERR)
             + _tag("shutting down\n" + _tb(_raise, KeyboardInterrupt()), "APIServer pid=1", ERR))
    log = before + after
    run = _run(r"ValueError: The repository \S+ contains custom code")
    assert run.assert_symptom(log, since=since).startswith("ValueError: The repository /tmp/x")
    with pytest.raises(AssertionError, match="does not show the declared symptom"):
        _run(r"RuntimeError: Found no NVIDIA driver").assert_symptom(log, since=since)
    with pytest.raises(AssertionError, match="no traceback in the log after offset"):
        run.assert_symptom(log, since=len(log))
    assert find_symptom(run.proof, log, since=since) is not None


# -- the patched run: the symptom nowhere ------------------------------------------------------

def test_absent_is_checked_in_the_whole_output_and_every_traceback():
    run = _run(r"in _to\n(?:  .*\n)*RuntimeError: Found no NVIDIA driver on your system")
    run.assert_absent("selftest: OK\n" + _tb(_bad_value))
    assert run.absent_checked
    # an earlier, handled traceback of a worker (tagged lines) still shows it: not absent
    with pytest.raises(AssertionError, match="shows the symptom too"):
        _run(run.proof.symptom).assert_absent(_tag(_tb(_no_driver), "Worker pid=3", WORKER_ERR) + "selftest: OK\n")
    with pytest.raises(AssertionError, match="shows the symptom too"):
        _run(r"RuntimeError: Found no NVIDIA").assert_absent(f"a line: RuntimeError: {NO_DRIVER}\n")
    _run(r"^ASYNC None$").assert_absent("ASYNC False\n", report=True)


# -- the declared symptoms --------------------------------------------------------------------

SYMPTOMS = sorted((p.id, p.proof) for p in REGISTRY.patches()
                  if p.proof is not None and p.proof.kind in SYMPTOM_KINDS)


@pytest.mark.parametrize("pid, proof", SYMPTOMS, ids=[pid for pid, _ in SYMPTOMS])
def test_no_symptom_reaches_across_the_log(pid, proof):
    """A symptom spanning lines crosses only the indented frame lines of one traceback
    (``(?:  .*\\n)*``), never any line (``(?:.*\\n)*?``): with the error it is matched against
    narrowed, a pattern free to cross lines would still join unrelated text."""
    assert "(?:.*\\n)*" not in proof.symptom, proof.symptom
    assert not re.search(r"\.\*\\n\)\*", proof.symptom.replace("(?:  .*\\n)*", "")), proof.symptom


#: pid -> the error its stock run ends with, as derived from the code that raises it (the frames
#: named: the call that fails; see each patch's ``upstream``); the symptom must match it as the
#: final error of a crashed run
STOCK_ERRORS = {
    "kv-cache-memory-from-platform": (
        '  File "/e/speculators/data_generation/vllm_hidden_states_generator.py", line 133, in __init__\n'
        "    free_memory, _ = torch.cuda.mem_get_info()\n"
        "                     ^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        '  File "/e/torch/cuda/memory.py", line 894, in mem_get_info\n'
        "    device = torch.cuda.current_device()\n"
        '  File "/e/torch/cuda/__init__.py", line 424, in _lazy_init\n'
        "    torch._C._cuda_init()\n"
        f"RuntimeError: {NO_DRIVER}"),
    "mem-get-info-from-platform": (
        '  File "/e/speculators/data_generation/vllm_hidden_states_generator.py", line 140, in __init__\n'
        "    free_memory, _ = mem_get_info()\n"
        "                     ^^^^^^^^^^^^^^\n"
        '  File "/e/speculators/utils/util.py", line 41, in mem_get_info\n'
        "    return mod.mem_get_info()\n"
        '  File "/e/torch/cuda/__init__.py", line 424, in _lazy_init\n'
        "    torch._C._cuda_init()\n"
        f"RuntimeError: {NO_DRIVER}"),
    "ehs-config": (
        '  File "/e/vllm/engine/arg_utils.py", line 1378, in create_speculative_config\n'
        "    return SpeculativeConfig(**self.speculative_config)\n"
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig\n"
        "method\n"
        "  Input should be 'ngram', 'medusa', 'mlp_speculator', 'draft_model', 'suffix', 'eagle', 'eagle3' or "
        "'mtp' [type=literal_error, input_value='extract_hidden_states', input_type=str]\n"
        "    For further information visit https://errors.pydantic.dev/2.14/v/literal_error"),
    "eagle3-deepseek-allow-list": (
        '  File "/e/vllm/engine/arg_utils.py", line 1378, in create_speculative_config\n'
        "    return SpeculativeConfig(**self.speculative_config)\n"
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig\n"
        "  Value error, Eagle3 is only supported for ['llama', 'qwen', 'minicpm'] models. Got "
        "self.target_model_config.hf_text_config.model_type='deepseek_v3' [type=value_error, "
        "input_value=ArgsKwargs((), {}), input_type=ArgsKwargs]\n"
        "    For further information visit https://errors.pydantic.dev/2.14/v/value_error"),
    "fused-loss-own-autotune-lists": (
        '  File "/e/torch/_dynamo/symbolic_convert.py", line 1000, in step\n'
        "    self.dispatch_table[inst.opcode](self, inst)\n"
        "torch._dynamo.exc.InternalTorchDynamoError: AssertionError: ListVariable(length=21) is already tracked "
        "for mutation\n\nfrom user code:\n   File \"/e/speculators/losses/fused.py\", line 200, in forward"),
    "ehs-connector-host-copy": (
        '  File "/e/vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py", line 579, '
        "in get_finished\n"
        "    self._submit_async_write(pending)\n"
        '  File "/e/vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py", line 402, '
        "in _submit_async_write\n"
        "    pinned_hs = torch.empty_like(\n"
        "                ^^^^^^^^^^^^^^^^^\n"
        f"RuntimeError: {NO_DRIVER}"),
    "device-name-without-accelerator": (
        '  File "/e/speculators/data_generation/config_generator.py", line 38, in _get_gpu_info\n'
        "    device_name = get_device_name(0)\n"
        '  File "/e/speculators/utils/util.py", line 60, in get_device_name\n'
        "    return torch.cuda.get_device_name(device)\n"
        '  File "/e/torch/cuda/__init__.py", line 424, in _lazy_init\n'
        "    torch._C._cuda_init()\n"
        f"RuntimeError: {NO_DRIVER}"),
    "train-device-without-cuda": (
        '  File "/w/spec_compat/cli/demo_steps.py", line 152, in train\n'
        "    d2t = torch.from_numpy(np.load(d2t_path)).to(device)\n"
        "          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        f"RuntimeError: {NO_DRIVER}"),
    "checkpoint-load-without-cuda": (
        '  File "/e/speculators/train/checkpointer.py", line 129, in load_model_state_dict\n'
        "    full_state_dict = load_safetensors_state_dict(\n"
        '  File "/e/safetensors/torch.py", line 315, in load_file\n'
        "    result[k] = f.get_tensor(k)\n"
        f"RuntimeError: {NO_DRIVER}"),
    "fsdp-without-cuda": (
        '  File "/e/speculators/train/trainer.py", line 104, in setup_model\n'
        '    m.to_empty(device="cuda")  # type: ignore[attr-defined]\n'
        '  File "/e/torch/nn/modules/module.py", line 1186, in to_empty\n'
        "    return self._apply(\n"
        f"RuntimeError: {NO_DRIVER}"),
    "train-local-rank-without-accelerator": (
        "  /e/speculators/train/trainer.py:348 in setup_model\n"
        "    self.model.to(self.local_rank)  # type: ignore[arg-type]\n"
        "  /e/torch/cuda/__init__.py:424 in _lazy_init\n"
        "    torch._C._cuda_init()\n"
        f"RuntimeError: {NO_DRIVER}"),
    "train-step-timer-without-accelerator": (
        "  /e/speculators/train/trainer.py:80 in mark\n"
        "    torch.accelerator.synchronize()\n"
        "  /e/torch/accelerator/__init__.py:200 in synchronize\n"
        "    torch._C._accelerator_synchronizeDevice(device_index)\n"
        f"RuntimeError: {NO_DRIVER}"),
    "kimi-k25-device-without-cuda": (
        '  File "/e/vllm/model_executor/models/kimi_k25.py", line 323, in __init__\n'
        "    self.device = torch.cuda.current_device()\n"
        "                  ^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        '  File "/e/torch/cuda/__init__.py", line 424, in _lazy_init\n'
        "    torch._C._cuda_init()\n"
        f"RuntimeError: {NO_DRIVER}"),
    "cpu-draft-token-copy": (
        '  File "/e/vllm/v1/worker/gpu_model_runner.py", line 3879, in _copy_draft_token_ids_to_cpu\n'
        "    with torch.cuda.stream(self.draft_token_ids_copy_stream):\n"
        '  File "/e/torch/cuda/__init__.py", line 424, in _lazy_init\n'
        "    torch._C._cuda_init()\n"
        f"RuntimeError: {NO_DRIVER}"),
    "cpu-eagle-padded-batch": (
        '  File "/e/vllm/v1/spec_decode/eagle.py", line 700, in prepare_next_token_ids_padded\n'
        "    BLOCK_SIZE=triton.next_power_of_2(vocab_size),\n"
        "AttributeError: module 'triton' has no attribute 'next_power_of_2'"),
    "cpu-rejection-sampler": (
        '  File "/e/vllm/v1/sample/rejection_sampler.py", line 400, in rejection_sample\n'
        "    rejection_greedy_sample_kernel[(batch_size,)](\n"
        "    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~^^^^^^^^^^^^^^^\n"
        "TypeError: 'function' object is not subscriptable"),
    "verifier-config-text-model": (
        '  File "/e/speculators/train/trainer.py", line 60, in _setup_embeddings_and_lm_heads\n'
        "    config = AutoConfig.from_pretrained(verifier_path)\n"
        '  File "/e/transformers/dynamic_module_utils.py", line 700, in resolve_trust_remote_code\n'
        "    raise ValueError(\n"
        "ValueError: The repository /tmp/kimi contains custom code which must be executed to correctly load the "
        "model. You can inspect the repository content at /tmp/kimi ."),
    "prefix-caching-off": (
        '  File "/e/vllm/v1/core/single_type_kv_cache_manager.py", line 150, in cache_blocks\n'
        "    assert len(request.block_hashes) >= num_full_blocks\n"
        "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "AssertionError"),
    "vllm-cpu-platform-detection": (
        '  File "/e/vllm/config/device.py", line 60, in __post_init__\n'
        "    self.device = torch.device(self.device_type)\n"
        "RuntimeError: Device string must not be empty"),
    "ehs-capture": (
        '  File "/w/spec_compat/patches/hidden_states/ehs_config/connector.py", line 109, in wait_for_save\n'
        '    raise RuntimeError(f"spec_compat[ehs-capture]: no hidden-state store in this worker: the patch '
        'ehs-capture is "\n'
        "RuntimeError: spec_compat[ehs-capture]: no hidden-state store in this worker: the patch ehs-capture is not "
        "applied (it covers vLLM's CPU model runner), nothing captures the layers"),
    "two-phase-step": (
        '  File "/e/vllm/v1/worker/gpu_model_runner.py", line 3318, in execute_model\n'
        "    raise RuntimeError(\n"
        "RuntimeError: State error: sample_tokens() must be called after execute_model() returns None."),
    "worker-forward-embed-input-ids": (
        '  File "/e/speculators/data_generation/custom_worker.py", line 30, in _patched_forward\n'
        "    inputs_embeds = self.get_input_embeddings(input_ids)\n"
        '  File "/e/torch/nn/modules/module.py", line 1964, in __getattr__\n'
        '    raise AttributeError(\n'
        "AttributeError: 'LlamaModel' object has no attribute 'get_input_embeddings'"),
    "decoder-stack-locator": (
        '  File "/e/speculators/data_generation/custom_worker.py", line 103, in _setup_hidden_states_capture\n'
        "    raise ValueError(\n"
        "ValueError: Model KimiK25ForConditionalGeneration does not support hidden state extraction"),
}


@pytest.mark.parametrize("pid", sorted(STOCK_ERRORS))
def test_declared_symptom_matches_the_stock_error(pid):
    proof = REGISTRY.get(pid).proof
    crash = "INFO 12-05 10:00:00 [llm.py:1] starting\nTraceback (most recent call last):\n" \
            '  File "/w/run.py", line 1, in <module>\n    main()\n' + STOCK_ERRORS[pid] + "\n"
    assert ProofRun(pid, proof).assert_symptom(crash), proof.symptom
    # the same error as a line of an earlier log, followed by an unrelated crash: not the symptom
    unrelated = "\n".join("WARNING 12-05 [x.py:1] " + ln for ln in crash.splitlines()) + "\n" + _tb(_raise, OSError("disk full"))
    assert find_symptom(proof, unrelated) is None
