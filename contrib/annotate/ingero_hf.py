"""Hugging Face Trainer callback: the training loop's steps and phases on ``ingero annotate``.

    from ingero_hf import IngeroMarks
    trainer = transformers.Trainer(..., callbacks=[IngeroMarks()])

Each finished optimizer step is a step mark (``step`` = ``state.global_step``). The Trainer
decides at ``on_step_end`` whether to evaluate and save and does both right after it, so the
phases ``evaluate`` (to ``on_evaluate``) and ``checkpoint`` (to ``on_save``) begin there and
cover the whole evaluation and write. Marks never stop training: without a server they are
dropped and counted (``annotator.dropped``).
"""

from __future__ import annotations

from typing import Any

from transformers.trainer_callback import TrainerCallback

from ingero.annotate.client import Annotator


class IngeroMarks(TrainerCallback):  # type: ignore[misc]
    def __init__(self, annotator: Annotator | None = None, path: str | None = None) -> None:
        self.annotator = annotator if annotator is not None else Annotator(path)
        self._open: set[str] = set()

    def _begin(self, name: str, step: int) -> None:
        if name not in self._open:
            self._open.add(name)
            self.annotator.phase(name, "begin", {"step": step})

    def _end(self, name: str) -> None:
        if name in self._open:
            self._open.discard(name)
            self.annotator.phase(name, "end")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step = int(state.global_step)
        self.annotator.step(step, {"epoch": float(state.epoch or 0.0)})
        if control.should_evaluate:
            self._begin("evaluate", step)
        if control.should_save:
            self._begin("checkpoint", step)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end("evaluate")

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._end("checkpoint")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        for name in sorted(self._open):
            self._end(name)
        self.annotator.close()
