"""The contrib callbacks driven by the real libraries, writing to a real annotate server.

Runs standalone (``python -m pytest tests/integration/annotate/test_callbacks_real.py``) with
ingero and pytest installed. The Hugging Face callback goes through the real
``CallbackHandler`` (transformers imports without torch); the real training runs (a tiny
Lightning fit, a tiny ``Trainer.train``) need torch and are skipped, with the reason, where
it does not import.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.integration.annotate.helpers import Server, annotate_server, contrib_module

pytestmark = pytest.mark.integration


def importable(*names: str) -> bool:
    try:
        return all(importlib.util.find_spec(n) is not None for n in names)
    except (ImportError, ValueError):
        return False


needs_transformers = pytest.mark.skipif(
    not importable("transformers"), reason="transformers is not installed"
)
needs_torch_lightning = pytest.mark.skipif(
    not importable("torch", "lightning"),
    reason="a real Lightning fit needs torch and lightning (not installed here)",
)
needs_torch_transformers = pytest.mark.skipif(
    not importable("torch", "transformers", "accelerate"),
    reason="a real Trainer.train needs torch, transformers and accelerate (not installed here)",
)


def phases(server: Server, name: str) -> list[dict[str, Any]]:
    return [m for m in server.marks() if m["kind"] == "phase" and m["name"] == name]


def steps(server: Server) -> list[int]:
    return [m["step"] for m in server.marks() if m["kind"] == "step"]


def stopped(server: Server) -> Server:
    """The server stopped: everything it received is in the node DB."""
    log = server.stop()
    assert "refused" not in log, log
    return server


@needs_transformers
def test_hf_callback_through_the_real_callback_handler(tmp_path: Path) -> None:
    from transformers.trainer_callback import TrainerControl, TrainerState

    hf = contrib_module("ingero_hf")
    with annotate_server(tmp_path) as server:
        marks = hf.IngeroMarks(path=str(server.socket))
        args, handler = hf_loop(
            tmp_path, marks, eval_strategy="steps", eval_steps=2, save_strategy="steps",
            save_steps=3,
        )  # fmt: skip
        state = TrainerState(max_steps=6, eval_steps=2, save_steps=3)
        control = TrainerControl()
        # The order Trainer calls them in: step end, then evaluation, then the save.
        control = handler.on_train_begin(args, state, control)
        for step in range(1, 7):
            control = handler.on_step_begin(args, state, control)
            state.global_step = step
            state.epoch = step / 6
            control = handler.on_step_end(args, state, control)
            if control.should_evaluate:
                control = handler.on_evaluate(args, state, control, metrics={"eval_loss": 1.0})
            if control.should_save:
                control = handler.on_save(args, state, control)
        handler.on_train_end(args, state, control)
        assert marks.annotator.dropped == 0
        stopped(server)
    assert steps(server) == [1, 2, 3, 4, 5, 6]
    assert {m["pid"] for m in server.marks()} == {os.getpid()}  # SO_PEERCRED: this process
    evaluate = phases(server, "evaluate")
    checkpoint = phases(server, "checkpoint")
    assert [json_step(m) for m in evaluate] == [2, 4, 6]
    assert [json_step(m) for m in checkpoint] == [3, 6]
    assert all(m["ts_end"] is not None and m["ts_end"] >= m["ts_start"] for m in evaluate)
    assert all(m["ts_end"] is not None and m["ts_end"] >= m["ts_start"] for m in checkpoint)
    rows = server.rows("SELECT SUM(count) AS n FROM intervals WHERE op = 'step'")
    assert rows == [{"n": 6}]


def hf_loop(tmp_path: Path, marks: Any, **options: Any) -> tuple[Any, Any]:
    """Real TrainingArguments and the real CallbackHandler, as Trainer builds them."""
    from transformers import TrainingArguments
    from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), logging_strategy="no", report_to=[], **options
    )
    return args, CallbackHandler([DefaultFlowCallback, marks], None, None, None, None)


def json_step(mark: dict[str, Any]) -> int:
    return int(json.loads(mark["labels"])["step"])


@needs_transformers
def test_hf_callback_without_a_server_counts_and_goes_on(tmp_path: Path) -> None:
    from transformers.trainer_callback import TrainerControl, TrainerState

    hf = contrib_module("ingero_hf")
    marks = hf.IngeroMarks(path=str(tmp_path / "no-server.sock"))
    args, handler = hf_loop(tmp_path, marks, save_strategy="no")
    state, control = TrainerState(max_steps=3), TrainerControl()
    for step in range(1, 4):
        state.global_step = step
        control = handler.on_step_end(args, state, control)
    assert marks.annotator.dropped == 3
    assert marks.annotator.sent == 0


@needs_torch_lightning
def test_lightning_callback_in_a_real_fit(tmp_path: Path) -> None:
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    lit = contrib_module("ingero_lightning")

    class Tiny(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
    with annotate_server(tmp_path) as server:
        marks = lit.IngeroMarks(path=str(server.socket))
        trainer = pl.Trainer(
            max_epochs=2,
            devices=1,
            callbacks=[marks],
            default_root_dir=str(tmp_path / "out"),
            logger=False,
            enable_progress_bar=False,
            num_sanity_val_steps=0,
            limit_val_batches=2,
        )
        trainer.fit(Tiny(), DataLoader(data, batch_size=2), DataLoader(data, batch_size=2))
        assert marks.annotator.dropped == 0
        stopped(server)
    assert steps(server) == list(range(1, 9))  # 4 batches x 2 epochs, the global step
    assert {m["pid"] for m in server.marks()} == {os.getpid()}
    validation = phases(server, "validation")
    assert len(validation) == 2
    checkpoint = phases(server, "checkpoint")
    assert len(checkpoint) >= 1  # ModelCheckpoint saves at least at the end of each epoch
    assert all(m["ts_end"] is not None for m in validation + checkpoint)
    rows = server.rows("SELECT SUM(count) AS n FROM intervals WHERE op = 'step'")
    assert rows == [{"n": 8}]


@needs_torch_transformers
def test_hf_callback_in_a_real_trainer_train(tmp_path: Path) -> None:
    import torch
    from transformers import Trainer, TrainingArguments

    hf = contrib_module("ingero_hf")

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
            out = self.layer(x)
            loss = torch.nn.functional.mse_loss(out, labels)
            return {"loss": loss, "logits": out}

    data = [{"x": torch.randn(4), "labels": torch.randn(1)} for _ in range(16)]
    with annotate_server(tmp_path) as server:
        args = TrainingArguments(
            output_dir=str(tmp_path / "out"),
            max_steps=6,
            per_device_train_batch_size=2,
            per_device_eval_batch_size=2,
            eval_strategy="steps",
            eval_steps=2,
            save_strategy="steps",
            save_steps=3,
            logging_strategy="no",
            report_to=[],
        )
        marks = hf.IngeroMarks(path=str(server.socket))
        trainer = Trainer(
            model=Tiny(),
            args=args,
            train_dataset=data,
            eval_dataset=data[:4],
            callbacks=[marks],
        )
        trainer.train()
        assert marks.annotator.dropped == 0
        stopped(server)
    assert steps(server) == [1, 2, 3, 4, 5, 6]
    assert {m["pid"] for m in server.marks()} == {os.getpid()}
    evaluate = phases(server, "evaluate")
    checkpoint = phases(server, "checkpoint")
    assert [json_step(m) for m in evaluate] == [2, 4, 6]
    assert [json_step(m) for m in checkpoint] == [3, 6]
    assert all(m["ts_end"] is not None for m in evaluate + checkpoint)
