"""T3 on speculators 0.8/0.9: the unified trainer (``speculators train``) on a machine without an
accelerator.  0.9.0 keeps the local rank in ``train/distributed.py`` and times every logged
step with ``torch.accelerator.synchronize()``; on a CUDA build of torch without a GPU both
start CUDA.  With an accelerator (or under torchrun) both patches (``train-local-rank-without-accelerator``,
``train-step-timer-without-accelerator``) pass straight through.
0.8.1 has the same code (``train/distributed.py`` identical; ``train/trainer.py`` L58/L68
``_StepTimer``, L192 ``get_local_rank()``, L340 ``model.to(self.local_rank)``).

What both patches share: the releases, their target module and their proof run."""

from __future__ import annotations

#: the speculators releases these were measured on (0.8.1, 0.9.0: train/distributed.py, train/trainer.py)
SPEC_09 = ">=0.8,<0.10"
TRAINER_09 = "speculators.train.trainer"
#: stock ``speculators train`` on data generated through vLLM, with the patch off
SPEC09_TRAINING = "tests/server/test_speculators_pipeline.py::test_stock_training_fails_without_the_patch"
