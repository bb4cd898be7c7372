"""--strategy fsdp (FSDP2) under torchrun with gloo on the CPU: it trains as DDP does, its sharded checkpoints
resume on the same number of processes exactly and on another one resharded, and export to one plain file."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import trainer
from tests.helpers import metric_rows
from trainer.config import TrainConfig
from trainer.extras.fsdp import fsdp_units, refusal
from trainer.runtime import resolve_runtime

ROOT = Path(__file__).resolve().parents[1]
ENV = {"OMP_NUM_THREADS": "1", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "300"}


def torchrun(
    n: int, out: Path, strategy: str, *extra: str, check: bool = True, **env_extra: str
) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n),
           str(ROOT / "tests" / "fsdp_script.py"), str(out), strategy, *extra]  # fmt: skip
    env = {**os.environ, **ENV, "PYTHONPATH": str(ROOT), **env_extra}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)  # only a hang
    assert proc.returncode == 0 or not check, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def last_val(run: Path) -> float:
    return [r for r in metric_rows(run) if r["kind"] == "val"][-1]["val_loss"]


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    """Two epochs sharded over 2 processes."""
    out = tmp_path_factory.mktemp("fsdp")
    proc = torchrun(2, out, "fsdp")
    return out / "fsdp", proc


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory):
    """The same run stopped after its first epoch (the schedule's horizon is fixed: lr_decay_steps)."""
    out = tmp_path_factory.mktemp("one")
    torchrun(2, out, "fsdp", "1")
    return out / "fsdp"


@pytest.mark.slow
def test_fsdp_and_ddp_of_the_same_seeded_task_agree(fsdp_run, tmp_path):
    run, proc = fsdp_run
    assert proc.stdout.count("fsdp: 3 unit(s) (Block x 3) and the root, sharded over 2 process(es)") == 1
    ddp = torchrun(2, tmp_path, "ddp")
    assert "fsdp:" not in ddp.stdout
    a, b = last_val(run), last_val(tmp_path / "ddp")
    assert abs(a - b) <= 1e-3 * abs(b), (a, b)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 10 and "ddp_max_weight_diff" not in summary
    test_ddp = json.loads((tmp_path / "ddp" / "summary.json").read_text())["final_metrics"]["test_loss"]
    assert abs(summary["final_metrics"]["test_loss"] - test_ddp) <= 1e-3 * test_ddp
    assert any(n.startswith("test: scored with the weights of") for n in summary["notes"])  # best.pt's folder
    # the checkpoint files name whole folders; no temporary folder is left
    ck = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert ck["model"]["world_size"] == 2 and (run / "checkpoints" / ck["model"]["dcp"] / ".metadata").is_file()
    assert not list((run / "checkpoints").glob(".*.tmp"))
    assert len(list((run / "checkpoints").glob("last.*.dcp"))) <= 2


@pytest.mark.slow
def test_a_non_finite_step_is_skipped_on_every_rank(tmp_path):
    """A NaN loss on one rank (its gradients finite): that rank poisons its own gradient shard, and the check of
    the sharded gradients (GradScaler's kernel, which DTensor reduces over the ranks) skips the step on every
    rank; rank 0, whose loss was finite, counts it too."""
    torchrun(2, tmp_path, "fsdp", FSDP_SCRIPT_NAN="1")
    summary = json.loads((tmp_path / "fsdp" / "summary.json").read_text())  # rank 0's
    assert summary["skipped_steps"] == 1


@pytest.mark.slow
def test_a_sharded_run_resumes_exactly_on_as_many_processes(fsdp_run, one_epoch, tmp_path):
    run = tmp_path / "fsdp"
    shutil.copytree(one_epoch, run)
    proc = torchrun(2, tmp_path, "fsdp", "2", str(run))
    assert "resharded" not in proc.stdout
    assert last_val(run) == last_val(fsdp_run[0])  # bit for bit: model, optimizer, schedule, data order


@pytest.mark.slow
def test_a_signal_to_one_rank_saves_every_shard_and_the_resume_is_exact(fsdp_run, tmp_path):
    """Rank 1 alone is signalled mid-epoch: the ranks agree to stop at the next log point, every rank writes its
    shards, and the resumed run ends with the uninterrupted run's validation loss, bit for bit."""
    proc = torchrun(2, tmp_path, "fsdp", check=False, FSDP_SCRIPT_SIGNAL="1")
    out = proc.stdout + proc.stderr
    assert "exitcode  : 143" in out and "]: Traceback" not in out, out[-3000:]
    run = tmp_path / "fsdp"
    ck = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert ck["step"] == 4 and ck["batches_done"] == 8  # mid-epoch 1 (5 steps per epoch)
    assert (run / "checkpoints" / ck["model"]["dcp"] / ".metadata").is_file()
    torchrun(2, tmp_path, "fsdp", "2", str(run))
    assert last_val(run) == last_val(fsdp_run[0])


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 3])
def test_a_sharded_run_resumes_on_another_number_of_processes(one_epoch, tmp_path, n):
    run = tmp_path / "fsdp"
    shutil.copytree(one_epoch, run)
    proc = torchrun(n, tmp_path, "fsdp", "2", str(run))
    assert proc.stdout.count(f"resume: the model and optimizer state of 2 processes resharded onto {n}") == 1
    assert f"sharded over {n} process(es)" in proc.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == n and summary["epochs"] == 2


@pytest.mark.slow
def test_export_writes_one_weights_only_file_with_the_trained_weights(fsdp_run, tmp_path):
    run = fsdp_run[0]
    out = trainer.export_model(run, tmp_path / "model.pt")
    weights = torch.load(out, weights_only=True)
    sys.argv = ["fsdp_script"]  # the script's module-level code is not run: take its model class only
    import importlib.util

    spec = importlib.util.spec_from_file_location("fsdp_net", ROOT / "tests" / "fsdp_script.py")
    assert spec is not None and spec.loader is not None
    src = (ROOT / "tests" / "fsdp_script.py").read_text()
    ns: dict = {}
    exec(src[: src.index("out, strategy")], ns)  # the imports and the model classes
    net = ns["Net"]()
    net.load_state_dict(weights)  # every key, every shape
    # the file holds the weights of the last checkpoint: the final validation loss again
    g = torch.Generator().manual_seed(0)
    x = torch.randn(384, 8, generator=g)
    y = x.sum(1, keepdim=True)
    with torch.no_grad():
        loss = float(nn.functional.mse_loss(net(x[320:]), y[320:]))
    assert abs(loss - last_val(run)) <= 1e-5 * last_val(run)
    from trainer.extras.fsdp import main

    assert main([str(run), str(tmp_path / "cli.pt")]) == 0
    assert torch.load(tmp_path / "cli.pt", weights_only=True).keys() == weights.keys()


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)


def test_the_units_are_a_module_lists_blocks_or_the_classes_the_model_names():
    net = nn.Sequential(nn.Linear(4, 4), nn.ModuleList([Block(), Block()]), nn.ReLU(), nn.Linear(4, 1))
    assert [type(u) for u in fsdp_units(net)] == [Block, Block]
    plain = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))  # no list: the repeated classes
    assert fsdp_units(plain) == [plain[0], plain[2]]
    net.fsdp_units = (nn.Linear,)
    assert len(fsdp_units(net)) == 4  # named: every Linear, the blocks' too


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"compile_model": True}, "--compile_model is not supported yet with --strategy fsdp"),
        ({"ema_decay": 0.99}, "--ema_decay is not supported yet"),
        ({"save_top_k": 3}, "--save_top_k above 1 is not supported yet"),
        ({"fsdp_cpu_offload": True}, "--fsdp_cpu_offload moves the shards off a GPU, and this run is on the CPU"),
    ],
)
def test_what_fsdp_does_not_run_yet_is_refused_in_one_line(given, says):
    rt = resolve_runtime("32", "cpu")
    why = refusal(TrainConfig(strategy="fsdp", **given), rt, nn.Linear(2, 2))
    assert why is not None and says in why and "\n" not in why


def test_a_lightning_style_model_is_refused_under_fsdp():
    class Lit(nn.Linear):
        def training_step(self, batch, i):  # noqa: ANN001
            return None

    why = refusal(TrainConfig(strategy="fsdp"), resolve_runtime("32", "cpu"), Lit(2, 2))
    assert why is not None and "LightningModule-style model (Lit" in why
