"""One place decides a save (the Checkpointer), and one function checks a resume (state.check_resume)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainer.state import Checkpointer, ResumeError, SaveClock, SettingsChanged, check_resume

ROOT = Path(__file__).resolve().parents[1]


def _names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        n.attr if isinstance(n, ast.Attribute) else n.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute | ast.Name)
    }


def test_the_loop_says_what_happened_and_the_checkpointer_decides():
    used = _names(ROOT / "trainer" / "loop.py")
    assert not used & {"clock", "_clock", "checkpoint_every", "checkpoint_interval", "SaveClock"}
    assert {"due_after_step", "due_at_epoch_end", "may_save"} <= used


def test_the_checkpointers_decisions():
    def cp(every: int | None, interval: float) -> SimpleNamespace:
        return SimpleNamespace(cfg=SimpleNamespace(checkpoint_every=every), _clock=SaveClock(interval))

    assert Checkpointer.due_after_step(cp(5, 1e9), 10, logged=False)
    assert not Checkpointer.due_after_step(cp(5, 1e9), 11, logged=True)
    assert not Checkpointer.due_after_step(cp(None, 0.0), 3, logged=True)  # epoch ends
    assert Checkpointer.due_at_epoch_end(cp(None, 0.0), False, ending=False)
    assert not Checkpointer.due_at_epoch_end(cp(None, 0.0), False, ending=True)
    assert Checkpointer.due_at_epoch_end(cp(None, 1e9), True, ending=True)  # a stop
    assert Checkpointer.may_save(cp(None, 1e9), epoch_end=False, at_end=True)


def test_one_resume_check_for_both_doors():
    cli = _names(ROOT / "train_optimized.py")
    assert "check_resume" in cli and "resume_changes" not in cli
    ckpt = {"task": "a", "world_size": 1, "step": 9, "settings": {"train": {"lr": 0.1, "epochs": 2}}}
    check_resume(ckpt, Path("x.pt"), {"train": {"lr": 0.1, "epochs": 5}}, "a", 1, 20)  # epochs may change
    with pytest.raises(ResumeError, match="not 'b'"):
        check_resume(ckpt, Path("x.pt"), {}, "b")
    with pytest.raises(ResumeError, match="of 1 process and this one has 2"):
        check_resume(ckpt, Path("x.pt"), {}, world_size=2)
    with pytest.raises(SettingsChanged) as e:
        check_resume(ckpt, Path("x.pt"), {"train": {"lr": 0.2}})
    assert e.value.changed == [("lr", 0.1, 0.2)]
    with pytest.raises(SettingsChanged) as e:
        check_resume(ckpt, Path("x.pt"), {}, total_steps=5)
    assert e.value.step == 9 and not e.value.changed
