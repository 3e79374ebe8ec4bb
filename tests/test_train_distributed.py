"""Training across processes (nemo_gym.train.distributed): two CPU ranks (gloo) under torch's launcher train like one.

The integration tests start `python -m torch.distributed.run --nproc_per_node=2 tests/train_distributed_worker.py`
on a tiny random Llama and compare with the same work done by one rank in this process: one `train_step` per loss
normalisation (the loss, the grad norm and the updated weights), and two steps of the real GRPO loop (rollouts
sampled from the tiny model on rank 0 only). The last one runs `ng_train +trainer.num_ranks=2` itself against a
real ng_run with the scripted policy, through the self-relaunch, and stops it with SIGTERM.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from ng_process import LAUNCHER_ENV, clean_env  # noqa: E402
from test_train_engine import make_tiny_model  # noqa: E402
from train_distributed_worker import CASES, LOOP_STEPS, run_case, run_loop, write_tasks  # noqa: E402

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.train import distributed  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "train_distributed_worker.py"


@pytest.fixture(autouse=True)
def one_thread():
    """The one-rank runs in this process use one thread, as each rank does (OMP_NUM_THREADS=1): the same kernels
    then sum in the same order, and the comparison sees the sharding, not the thread count's rounding."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -- pieces ------------------------------------------------------------------------------------------------------
def test_shard_is_contiguous_and_balanced():
    assert [distributed.shard(5, r, 2) for r in range(2)] == [slice(0, 3), slice(3, 5)]
    assert [distributed.shard(7, r, 3) for r in range(3)] == [slice(0, 3), slice(3, 5), slice(5, 7)]
    assert [distributed.shard(1, r, 2) for r in range(2)] == [slice(0, 1), slice(1, 1)]  # rank 1: no row


def test_relaunch_only_without_a_launcher(monkeypatch):
    for name in LAUNCHER_ENV:
        monkeypatch.delenv(name, raising=False)
    assert not distributed.needs_relaunch(1)
    assert distributed.needs_relaunch(2)
    monkeypatch.setenv("WORLD_SIZE", "1")  # what set_single_process_env leaves behind: still one process
    assert distributed.needs_relaunch(2)
    monkeypatch.setenv("WORLD_SIZE", "2")  # a rank started by torchrun / the deepspeed launcher
    assert not distributed.needs_relaunch(2) and not distributed.needs_relaunch(1)


def test_launcher_command_runs_the_same_arguments():
    argv = ["+config_paths=[configs/train/quickstart_grpo.yaml]", "+trainer.num_ranks=2"]
    command = distributed.launcher_command(2, argv, 29512)
    assert command == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--nnodes=1",
        "--master_addr=127.0.0.1",
        "--master_port=29512",
        "-m",
        "nemo_gym.train.distributed",
        *argv,
    ]
    help_text = subprocess.run(
        [sys.executable, "-m", "nemo_gym.train.distributed", "+help=true"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert help_text.returncode == 0 and "trainer" in help_text.stdout  # the module each rank runs is ng_train


# -- two ranks = one rank -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    model = make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=2)
    write_tasks(model)
    return model


@pytest.fixture(scope="module")
def two_ranks(tiny_model, tmp_path_factory) -> Path:
    """The worker's output folder after its 2-rank run (engine cases, then the loop in `loop/`)."""
    from nemo_gym.common.processes import free_port

    out = tmp_path_factory.mktemp("two_ranks")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--nnodes=1",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        str(WORKER),
        str(tiny_model),
        str(out),
    ]
    done = subprocess.run(command, cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-6000:]
    return out


@pytest.mark.long
@pytest.mark.integration
def test_two_ranks_take_the_one_rank_step(tiny_model, two_ranks):
    """Cases (train_distributed_worker.CASES): 5 sequences of uneven length split 3 + 2 over the ranks, token- and
    sequence-level normalisation; 1 sequence, so rank 1 has none. Same loss metrics, grad norm (before clipping;
    it catches a wrong scale, which Adam's first step would hide) and weights after the AdamW step."""
    from transformers import AutoModelForCausalLM

    initial = dict(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).named_parameters())
    for case in CASES:
        one, two = run_case(tiny_model, case), torch.load(two_ranks / f"{case}.pt", weights_only=False)
        assert one["metrics"].keys() == two["metrics"].keys(), case
        for key, value in one["metrics"].items():
            assert two["metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-7), (case, key)
        assert one["metrics"]["grad_norm"] > 0
        assert any(not torch.equal(weight, initial[name]) for name, weight in one["weights"].items()), (
            case
        )  # the step moved them
        for name, weight in one["weights"].items():
            # atol 1e-4 = 1e-2 of the step size (lr 1e-2): AdamW's first step is lr · g / (|g| + eps), so entries whose
            # gradient is near eps (1e-8) amplify float-order noise of the summed gradients: ~1e-6 on AVX-512 machines,
            # 2.4e-5 on an AVX2-only AMD EPYC (2 of 8192 entries); a wrong shard or sign moves an entry by ~1e-2
            torch.testing.assert_close(
                two["weights"][name], weight, rtol=1e-5, atol=1e-4, msg=lambda m: f"{case} {name}: {m}"
            )


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.integration
def test_deepspeed_launcher_runs_the_same_ranks(tiny_model, two_ranks, tmp_path):
    """The deepspeed launcher (`deepspeed --num_gpus 2`, which on a CPU machine starts 2 gloo ranks) in place of
    torchrun: the same step results as under torchrun."""
    from nemo_gym.common.processes import free_port

    command = [
        str(Path(sys.executable).parent / "deepspeed"),
        "--num_gpus",
        "2",
        "--no_local_rank",
        "--master_port",
        str(free_port()),
        str(WORKER),
        str(tiny_model),
        str(tmp_path),
    ]
    done = subprocess.run(command, cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-6000:]
    assert "dist_world_size=2" in done.stdout + done.stderr
    for case in CASES:
        by_deepspeed, by_torchrun = (
            torch.load(tmp_path / f"{case}.pt", weights_only=False),
            torch.load(two_ranks / f"{case}.pt", weights_only=False),
        )
        assert by_deepspeed["metrics"] == pytest.approx(by_torchrun["metrics"], rel=1e-6), case
        for name, weight in by_torchrun["weights"].items():
            torch.testing.assert_close(by_deepspeed["weights"][name], weight, rtol=1e-6, atol=1e-7)
    assert len(steps_of(tmp_path / "loop")) == LOOP_STEPS


# -- the loop: two ranks = one rank, only rank 0 collects and writes
# ------------------------------------------------------
def steps_of(out: Path) -> list[dict]:
    return read_jsonl(out / "metrics.jsonl")


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.integration
def test_two_rank_loop_matches_one_rank_and_only_rank_0_collects(tiny_model, two_ranks, tmp_path):
    from safetensors.torch import load_file

    assert run_loop(tiny_model, tmp_path / "one") == 0
    one, two = steps_of(tmp_path / "one"), steps_of(two_ranks / "loop")
    assert [m["step"] for m in two] == list(range(1, LOOP_STEPS + 1))  # logged once per step: by rank 0 only
    assert any(m["trained"] for m in one)
    for a, b in zip(one, two):
        assert a["trained"] == b["trained"] and a["reward_mean"] == pytest.approx(b["reward_mean"])
        if a["trained"]:
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-7) and b["grad_norm"] == pytest.approx(
                a["grad_norm"], rel=1e-5
            )
    collected = sorted(p.name for p in (two_ranks / "loop").glob("collect_rank*"))
    assert collected == [f"collect_rank0_step_{s:06d}" for s in range(1, LOOP_STEPS + 1)]
    assert (two_ranks / "loop" / "checkpoints" / "latest_step").read_text() == f"step_{LOOP_STEPS:06d}"
    final_one, final_two = (
        load_file(tmp_path / "one" / "final" / "model.safetensors"),
        load_file(two_ranks / "loop" / "final" / "model.safetensors"),
    )
    assert final_one.keys() == final_two.keys()
    for name in final_one:
        torch.testing.assert_close(final_two[name], final_one[name], rtol=1e-5, atol=1e-5)


# -- ng_train itself: the relaunch and a stop, against a real ng_run
# ------------------------------------------------------
def wait_for_steps(out: Path, count: int, process: subprocess.Popen, log: Path, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (out / "metrics.jsonl").is_file() and len(steps_of(out)) >= count:
            return
        assert process.poll() is None, f"ng_train exited with {process.returncode}:\n{log.read_text()[-6000:]}"
        time.sleep(0.5)
    raise TimeoutError(f"no {count} steps in {timeout_s} s:\n{log.read_text()[-6000:]}")


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.integration
def test_ng_train_relaunches_as_two_ranks_and_stops_on_sigterm(tmp_path):
    """`ng_train +trainer.num_ranks=2` (the plain command) attached to a real ng_run whose policy is the scripted model
    (it answers alike, so no group varies and every step is logged without an update: no vLLM needed). It relaunches
    under torch's launcher; rank 0 collects and logs, both ranks write the DeepSpeed checkpoint of every step. SIGTERM
    to the command (as `ng_runs stop +save_model=true` sends it, with its stop request) reaches both ranks through
    the launcher; they stop at the same step, rank 0 saves final/, the command exits with 143."""
    from ng_process import BIN, NgRun

    from nemo_gym.train.stopping import BACKGROUND_RUN_DIR_ENV, STOP_REQUEST_FILE

    record, out, log = tmp_path / "record", tmp_path / "out", tmp_path / "train.log"
    record.mkdir()
    (record / STOP_REQUEST_FILE).write_text(json.dumps({"save_model": True}))
    with NgRun("+config_paths=[tests/configs/weather_scripted.yaml]", "+skip_venv=true") as servers:
        argv = [
            "+trainer.input_jsonl_fpath=resources_servers/example_single_tool_call/data/example.jsonl",
            "+trainer.agent_name=weather_agent",
            f"+trainer.output_dir={out}",
            "+trainer.num_steps=100000",
            "+trainer.batch_size=2",
            "+trainer.group_size=2",
            "+trainer.num_ranks=2",
            "+trainer.checkpoint_interval=1",
            f"+trainer.engine.model_path={make_tiny_model(tmp_path / 'tiny')}",
            "+trainer.sync_weights=false",
            f"+trainer.head_server_url={servers.wait_ready()}",
            "+trainer.logging.console=false",
            "+trainer.logging.tensorboard=false",
        ]
        with log.open("w") as handle:
            process = subprocess.Popen(
                [str(BIN / "ng_train"), *argv],
                cwd=REPO,
                env=clean_env() | {BACKGROUND_RUN_DIR_ENV: str(record)},
                stdout=handle,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_for_steps(out, 2, process, log)
            process.send_signal(signal.SIGTERM)
            assert process.wait(120) == 128 + signal.SIGTERM, log.read_text()[-6000:]
        finally:
            if process.poll() is None:  # a second signal aborts every rank (forwarded through the launcher)
                process.send_signal(signal.SIGTERM)
                process.send_signal(signal.SIGTERM)
                process.wait(60)
    text = log.read_text()
    assert "ng_train: 2 ranks: " in text and "-m torch.distributed.run --nproc_per_node=2" in text
    steps = steps_of(out)
    assert [m["step"] for m in steps] == list(range(1, len(steps) + 1)) and not any(
        m["trained"] for m in steps
    )  # each logged once
    assert (
        out / "checkpoints" / "latest_step"
    ).read_text() == f"step_{len(steps):06d}"  # the last logged step was saved
    assert len((out / "rollouts" / f"step_{len(steps):06d}.jsonl").read_text().splitlines()) == 4  # 2 tasks x 2
    assert text.count(f"ng_train: stopped after step {len(steps)}; model saved in") == 2  # both ranks stopped there
    assert (out / "final" / "model.safetensors").is_file()
