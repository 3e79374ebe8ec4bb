"""Background runs (nemo_gym.runs.background, ng_runs) with real detached processes, and the trainer's stop handler.

The detached commands are real ng_* commands: `ng_version` and a failing `ng_dump_config` (quick), `ng_run` of one
scripted model server as a long-running stand-in (integration), and a real `ng_train +background=true` on a tiny
random model whose rollouts all fail (no policy server: vLLM cannot run here), stopped with +save_model=true
(integration). The stop handler itself is tested at the TrainingLoop level (GRPO recipe), with rollouts sampled from the
tiny model.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import time
from pathlib import Path

import pytest

from nemo_gym.cli import main
from nemo_gym.runs.background import detach, list_records, load_record, run_status, wait_until_ended
from nemo_gym.runs.command import pop_flag
from nemo_gym.train.stopping import BACKGROUND_RUN_DIR_ENV

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """A private NEMO_GYM_HOME (records, ng_run state) inherited by the detached processes; the repo as cwd."""
    monkeypatch.setenv("NEMO_GYM_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(REPO)
    return tmp_path / "home"


def wait_for(predicate, timeout_s: float = 120.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise TimeoutError(f"{what} not reached in {timeout_s} s")


def runs_json(capsys) -> list[dict]:
    capsys.readouterr()
    assert main("runs", ["list", "+json=true"]) == 0
    return json.loads(capsys.readouterr().out)


def test_pop_flag_and_positional_arguments(capsys):
    assert pop_flag(["+a=1", "+background=true", "b=2"], "background") == (["+a=1", "b=2"], True)
    assert pop_flag(["++background=false"], "background") == ([], False)
    assert main("runs", ["stop"]) == 2 and "needs a run id" in capsys.readouterr().err
    assert main("runs", ["logs", "x", "y"]) == 2 and "too many arguments" in capsys.readouterr().err
    assert main("runs", ["logs", "x", "+id=x"]) == 2 and "given twice" in capsys.readouterr().err
    assert main("runs", ["show"]) == 2 and "+verb" in capsys.readouterr().err
    assert main("runs", ["logs", "nope"]) == 2 and "no background run 'nope'" in capsys.readouterr().err


def test_detached_command_finishes_and_is_recorded(home, capsys):
    record = detach("version", ["+json=true"])
    assert record.id.startswith("version-") and record.pgid == record.pid
    assert wait_until_ended(record, 60)
    assert wait_for(lambda: run_status(record) == "finished", 10, "finished")
    assert stat.S_IMODE((home / "train_runs").stat().st_mode) == 0o700
    saved = json.loads((record.dir / "run.json").read_text())
    assert {"id", "pid", "pgid", "argv", "output_dir", "log", "started", "status"} <= saved.keys() and saved[
        "argv"
    ] == ["+json=true"]
    assert json.loads((record.dir / "exit.json").read_text())["returncode"] == 0
    assert json.loads((record.dir / "run.json").read_text())["status"] == "finished"  # the wrapper's last word
    [listed] = runs_json(capsys)
    assert listed["id"] == record.id and listed["status"] == "finished" and listed["returncode"] == 0
    assert main("runs", ["logs", record.id[:-2]]) == 0  # a unique prefix of the id is enough
    assert json.loads(capsys.readouterr().out)["nemo_gym"]  # the command's own output, from its log
    assert main("runs", ["logs", record.id, "+follow=true"]) == 0  # an ended run: follow returns at once
    assert main("runs", ["delete", record.id]) == 0
    assert not record.dir.exists() and list_records() == []


def test_detached_command_that_fails(capsys):
    record = detach("dump_config", ["+config_paths=[does_not_exist.yaml]"])
    assert wait_until_ended(record, 60)
    assert wait_for(lambda: run_status(record) == "failed", 10, "failed")
    assert main("runs", []) == 0
    assert "failed" in capsys.readouterr().out
    assert "does_not_exist.yaml" in Path(record.log).read_text()


SCRIPTED_ONLY = """# ng_run "+config_paths=[<this file>]"
policy_model:
  responses_api_models:
    scripted_model:
      entrypoint: app.py
"""


@pytest.mark.long
@pytest.mark.integration
def test_long_running_command_lifecycle(tmp_path, capsys):
    """ng_run (one scripted model server) detached: running, listed by ng_status, delete refused, stop, delete."""
    from nemo_gym.serving.head import live_runs

    config = tmp_path / "scripted.yaml"
    config.write_text(SCRIPTED_ONLY)
    output_dir = tmp_path / "out"
    output_dir.mkdir()
    (output_dir / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "reward_mean": 0.25}) + "\n" + json.dumps({"step": 2, "reward_mean": 0.5}) + "\n"
    )
    record = detach(
        "run",
        [f"+config_paths=[{config}]", "+skip_venv=true", "+head_server.port=0"],
        output_dir=output_dir,
        extra={"num_steps": 10},
    )
    try:
        wait_for(lambda: "servers ready" in Path(record.log).read_text(), 120, "ng_run ready")
        [listed] = runs_json(capsys)
        assert (listed["status"], listed["step"], listed["num_steps"], listed["reward"]) == ("running", 2, 10, 0.5)
        main("status", [])
        shown = capsys.readouterr().out
        assert "Background runs: 1 running" in shown and record.id in shown and "2/10" in shown
        assert main("runs", ["delete", record.id]) == 2 and "is running" in capsys.readouterr().err
        assert main("runs", ["stop", record.id, "+timeout_s=60"]) == 0
        assert f"run {record.id} stopped" in capsys.readouterr().out
        assert run_status(load_record(record.id)) == "stopped" and live_runs() == []
        assert (
            json.loads((record.dir / "exit.json").read_text())["returncode"] == 0
        )  # ng_run stops its servers on SIGTERM
    finally:
        if run_status(record) == "running":
            os.killpg(record.pgid, signal.SIGKILL)
    assert main("runs", ["delete", record.id, "+delete_outputs=true"]) == 0
    assert not output_dir.exists() and not record.dir.exists()


@pytest.mark.long
@pytest.mark.integration
def test_force_stop_kills_the_group_and_lets_child_sessions_clean_up(tmp_path, capsys):
    """+force=true: SIGKILL to the run's group; the servers ng_run started in their own sessions get SIGTERM."""
    import psutil

    config = tmp_path / "scripted.yaml"
    config.write_text(SCRIPTED_ONLY)
    record = detach("run", [f"+config_paths=[{config}]", "+skip_venv=true", "+head_server.port=0"])
    try:
        wait_for(lambda: "servers ready" in Path(record.log).read_text(), 120, "ng_run ready")
        children = psutil.Process(record.pid).children(recursive=True)
        assert any(os.getpgid(c.pid) != record.pgid for c in children)  # the server leads its own group
        assert main("runs", ["stop", record.id, "+force=true", "+timeout_s=30"]) == 0
        assert run_status(record) == "stopped" and not (record.dir / "exit.json").exists()  # killed: no exit status
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    finally:
        if run_status(record) == "running":
            os.killpg(record.pgid, signal.SIGKILL)


# -- the trainer's stop handler ----------------------------------------------------------------------------------
torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from test_train_engine import make_tiny_model  # noqa: E402
from test_train_loop import PROMPT, sampled_rollouts  # noqa: E402

from nemo_gym.train.config import EngineConfig, LoggingOptions, TrainerConfig  # noqa: E402
from nemo_gym.train.grpo import GRPORecipe  # noqa: E402
from nemo_gym.train.loop import TrainingLoop  # noqa: E402
from nemo_gym.train.stopping import STOP_REQUEST_FILE, run_stoppable  # noqa: E402


def trainer_config(tmp_path: Path, **overrides) -> TrainerConfig:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"responses_create_params": {"input": f"task {i}"}}) + "\n" for i in range(2)))
    values = dict(
        input_jsonl_fpath=str(tasks),
        agent_name="agent",
        output_dir=str(tmp_path / "out"),
        num_steps=3,
        batch_size=2,
        group_size=4,
        engine=EngineConfig(
            model_path=str(make_tiny_model(tmp_path / "tiny", seed=1)), learning_rate=1e-2, micro_batch_size=8
        ),
        sync_weights=False,
        head_server_url="http://127.0.0.1:9",
        checkpoint_interval=1,
        logging=LoggingOptions(console=False, tensorboard=False),
    )
    return TrainerConfig(**{**values, **overrides})


class LocalGRPO(GRPORecipe):
    """The GRPO recipe with rollouts sampled from the tiny model itself (the servers and vLLM cannot run here)."""

    def collect(self, tasks, num_repeats, name, overrides=None):
        if self.loop.signal_at == ("collect", self.loop.step):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # waiting for rollouts: the handler interrupts this
            raise AssertionError("the stop did not abandon the rollouts")
        return sampled_rollouts(self.engine.module, len(tasks), num_repeats, self.loop.step)


class LocalTrainer(TrainingLoop):
    """The training loop running `LocalGRPO`. `signal_at` = (hook, step): send SIGTERM to this process from the
    recipe's `collect` (rollouts: abandonable) or `log` (after the optimizer step: not abandonable) when
    `self.step` equals `step`."""

    signal_at: tuple[str, int] = ("", -1)

    def __init__(self, cfg: TrainerConfig, argv: list[str]):
        super().__init__(LocalGRPO(cfg, argv))

    def log(self, metrics):
        super().log(metrics)
        if self.signal_at == ("log", self.step):
            os.kill(os.getpid(), signal.SIGTERM)


def metric_steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_stop_during_rollouts_abandons_the_step_and_saves_final(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    record_dir = tmp_path / "record"
    record_dir.mkdir()
    (record_dir / STOP_REQUEST_FILE).write_text(
        json.dumps({"save_model": True})
    )  # as `ng_runs stop +save_model=true` writes it
    monkeypatch.setenv(BACKGROUND_RUN_DIR_ENV, str(record_dir))
    trainer = LocalTrainer(trainer_config(tmp_path), [])
    trainer.signal_at = ("collect", 1)  # during the rollouts of the second step
    handler_before = signal.getsignal(signal.SIGTERM)
    assert run_stoppable(trainer) == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is handler_before  # the trainer's handlers are removed again
    out = Path(trainer.cfg.output_dir)
    assert trainer.step == 1 and metric_steps(out) == [1]  # step 2 abandoned: nothing logged for it
    assert (out / "checkpoints" / "latest_step").read_text() == "step_000001"
    reloaded = AutoModelForCausalLM.from_pretrained(out / "final", dtype=torch.float32)
    ids = torch.tensor([PROMPT + [5, 6, 7]])
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=ids).logits, trainer.engine.module(input_ids=ids).logits, atol=1e-6)


def test_stop_after_the_optimizer_step_finishes_it_and_saves_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(BACKGROUND_RUN_DIR_ENV, raising=False)  # a plain SIGTERM: no stop request, no final/
    trainer = LocalTrainer(trainer_config(tmp_path), [])
    trainer.signal_at = ("log", 1)  # right after step 1 is logged, before its checkpoint
    assert run_stoppable(trainer) == 128 + signal.SIGTERM
    out = Path(trainer.cfg.output_dir)
    assert trainer.step == 1 and metric_steps(out) == [1]
    assert (out / "checkpoints" / "latest_step").read_text() == "step_000001"  # the step finished, checkpoint included
    assert not (out / "final").exists()


# -- a real background ng_train ----------------------------------------------------------------------------------
@pytest.mark.long
@pytest.mark.slow
@pytest.mark.integration
def test_background_train_stop_with_save_model(tmp_path, capsys, monkeypatch):
    """`ng_train +background=true` on a tiny model, attached to a real ng_run whose policy is the scripted model (it
    always answers the same, so every group has equal rewards and the steps are logged without an update: the run
    needs no vLLM); listed with its steps, refused a second run on the same output_dir, then stopped with
    `ng_runs stop +save_model=true`, which leaves final/ behind."""
    from ng_process import NgRun

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):  # set by this process's own engines
        monkeypatch.delenv(name, raising=False)  # (set_single_process_env); the background trainer picks its own
    out = tmp_path / "out"
    with NgRun("+config_paths=[tests/configs/weather_scripted.yaml]", "+skip_venv=true") as servers:
        argv = [
            "+trainer.input_jsonl_fpath=resources_servers/example_single_tool_call/data/example.jsonl",
            "+trainer.agent_name=weather_agent",
            f"+trainer.output_dir={out}",
            "+trainer.num_steps=100000",
            "+trainer.batch_size=2",
            "+trainer.group_size=2",
            f"+trainer.engine.model_path={make_tiny_model(tmp_path / 'tiny')}",
            "+trainer.sync_weights=false",
            f"+trainer.head_server_url={servers.wait_ready()}",
            "+trainer.logging.console=false",
            "+trainer.logging.tensorboard=false",
            "+background=true",
        ]
        capsys.readouterr()
        assert main("train", argv) == 0
        run_id = capsys.readouterr().out.strip()
        record = load_record(run_id)
        assert run_id.startswith("train-") and record.output_dir == str(out) and record.extra["num_steps"] == 100000
        try:
            wait_for(
                lambda: (
                    run_status(record) != "running"
                    or (out / "metrics.jsonl").is_file()
                    and (out / "metrics.jsonl").read_text().strip()
                ),
                180,
                "a first step",
            )
            [listed] = runs_json(capsys)
            assert listed["status"] == "running" and listed["step"] >= 1, Path(record.log).read_text()[-3000:]
            assert main("train", argv) == 2 and "still writing to" in capsys.readouterr().err  # one run per output_dir
            stopped = main("runs", ["stop", run_id, "+save_model=true", "+timeout_s=120"])
            assert stopped == 0, Path(record.log).read_text()[-3000:]  # the trainer's last lines say where it was
            assert "stopped; model in" in capsys.readouterr().out
        finally:
            if run_status(record) == "running":
                os.killpg(record.pgid, signal.SIGKILL)
    assert (out / "final" / "model.safetensors").is_file()
    assert json.loads((record.dir / "exit.json").read_text())["returncode"] == 128 + signal.SIGTERM
    assert "SIGTERM received" in Path(record.log).read_text()
