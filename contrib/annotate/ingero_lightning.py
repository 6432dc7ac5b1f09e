"""PyTorch Lightning callback: the training loop's steps and phases on ``ingero annotate``.

    from ingero_lightning import IngeroMarks
    trainer = lightning.pytorch.Trainer(callbacks=[IngeroMarks()])

Each finished training batch is a step mark (``step`` = the trainer's global step), so the
node's step rate is the job's own; validation is the phase ``validation``; a checkpoint is the
phase ``checkpoint`` from ``on_save_checkpoint`` (the checkpoint dict is being built) to the
next hook the loop calls (the file written). Marks never stop training: without a server
they are dropped and counted (``annotator.dropped``).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback

from ingero.annotate.client import Annotator


class IngeroMarks(Callback):
    def __init__(self, annotator: Annotator | None = None, path: str | None = None) -> None:
        self.annotator = annotator if annotator is not None else Annotator(path)
        self._checkpoint_open = False

    def _close_checkpoint(self) -> None:
        if self._checkpoint_open:
            self._checkpoint_open = False
            self.annotator.phase("checkpoint", "end")

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self._close_checkpoint()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._close_checkpoint()
        self.annotator.step(int(trainer.global_step), {"epoch": int(trainer.current_epoch)})

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._close_checkpoint()
        self.annotator.phase("validation", "begin")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.annotator.phase("validation", "end")

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        if not self._checkpoint_open:
            self._checkpoint_open = True
            self.annotator.phase("checkpoint", "begin", {"step": int(trainer.global_step)})

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._close_checkpoint()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close_checkpoint()
        self.annotator.close()
