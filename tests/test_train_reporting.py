"""The trainer's metrics reporting (nemo_gym.train.reporting): metrics.jsonl, console, TensorBoard, W&B offline.

One reporter with every sink on logs three steps and two evaluations (module fixture, one W&B run of ~2 s);
the tests read each sink's output back: the TensorBoard event file with tensorboard's EventAccumulator, the
W&B offline run's transaction log (`run-<id>.wandb`: LevelDB log records of wandb's protobuf `Record`s).
During the run WANDB_API_KEY holds a canary and every W&B / proxy URL points at a local listener that counts
connections, so a network call or a leaked key would be seen.
"""

from __future__ import annotations

import base64
import io
import json
import socket
import struct
import threading
import uuid
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch")
pytest.importorskip("tensorboard")
wandb = pytest.importorskip("wandb")

from rich.console import Console  # noqa: E402

from nemo_gym.train.config import LoggingOptions, TrainerConfig, WandbOptions  # noqa: E402
from nemo_gym.train.reporting import (
    MetricsReporter,
    metric_tag,
    persistent_wandb_run_id,
    resolve_wandb_mode,
    with_derived,
)  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
CANARY = f"nemo-gym-canary-{uuid.uuid4().hex}"


def step_metrics(step: int) -> dict:
    """What the loop logs for a trained step (a subset of its keys, values chosen per step)."""
    return {
        "step": step,
        "rollouts": 8,
        "groups_total": 2,
        "groups_zero_variance": 1,
        "groups_incomplete": 0,
        "reward_mean": 0.25 * step,
        "reward_std": 0.5,
        "pass_rate": 0.125 * step,
        "advantage_mean": 0.0,
        "advantage_std": 0.9,
        "loss": -0.01 * step,
        "policy_loss": -0.01 * step,
        "clip_fraction_low": 0.01,
        "clip_fraction_high": 0.02,
        "ratio_mean": 1.0,
        "tis_weight_mean": 0.99,
        "rollout_logprob_abs_diff_max": 3e-5,
        "entropy": 2.5,
        "grad_norm": 0.4,
        "learning_rate": 1e-6,
        "num_tokens": 100.0,
        "tokens_per_s": 50.0,
        "time_generation_s": 3.0,
        "time_training_s": 2.0,
        "time_sync_s": 0.5,
        "trained": True,
    }


class ConnectionTrap:
    """A TCP listener on 127.0.0.1 that accepts and counts connections (a stand-in for 'the network')."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.server.close()


def wandb_records(run_file: Path) -> list:
    """wandb's protobuf `Record`s of an offline run file: a 7-byte header (`:W&B`, magic, version), then LevelDB
    log records (crc32 u32, length u16, type u8: 1 full, 2 first, 3 middle, 4 last) in 32 KiB blocks."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, pending, records = run_file.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer: zero padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_history(run_dir: Path) -> list[dict]:
    (run_file,) = run_dir.glob("run-*.wandb")
    rows = []
    for record in wandb_records(run_file):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """Every sink on: eval at step 0, steps 1-3, eval again at step 3 (with the step's metrics, as the loop does)."""
    root = tmp_path_factory.mktemp("report")
    out, wandb_dir = root / "out", root / "wandb_dir"
    trap = ConnectionTrap()
    console_file = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        for name in ("NO_PROXY", "no_proxy", "WANDB_IDENTITY_TOKEN_FILE"):
            mp.delenv(name, raising=False)
        for name in (
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
            "WANDB_BASE_URL",
        ):
            mp.setenv(name, trap.url)
        mp.setenv("WANDB_API_KEY", CANARY)
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_DIR", str(wandb_dir))
        for name in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
            mp.setenv(name, str(root / name.lower()))
        mp.setenv("WANDB_ERROR_REPORTING", "false")
        options = LoggingOptions(
            console=True, tensorboard=True, wandb=WandbOptions(enabled=True, project="test", name="reporting")
        )
        reporter = MetricsReporter(
            options, out, total_steps=3, run_config={"num_steps": 3}, console=Console(file=console_file, width=300)
        )
        with reporter:
            reporter.log_eval(0, {"reward_mean": 0.1, "pass_at_1": 0.0, "rollouts": 4})
            for step in (1, 2, 3):
                reporter.log(step, step_metrics(step))
            reporter.log_eval(3, {"eval_reward_mean": 0.6, "eval_pass_at_1": 0.5, "eval_rollouts": 4})
    trap.close()
    return {
        "root": root,
        "out": out,
        "wandb_dir": wandb_dir,
        "console": console_file.getvalue(),
        "connections": trap.connections,
    }


@pytest.mark.long
def test_jsonl_has_a_line_per_call_with_derived_metrics(reported):
    lines = [json.loads(line) for line in (reported["out"] / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2, 3, 3]
    assert lines[0]["eval_reward_mean"] == 0.1 and "reward_mean" not in lines[0]
    assert lines[2]["reward_mean"] == 0.5
    assert lines[2]["clip_fraction"] == pytest.approx(0.03)  # 0.01 low + 0.02 high
    assert lines[2]["time_step_s"] == pytest.approx(5.5)  # 3.0 generation + 2.0 training + 0.5 sync


def test_tensorboard_event_file_holds_every_step(reported):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(reported["out"] / "tensorboard"))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    for step in (1, 2, 3):
        for key, value in with_derived(step_metrics(step)).items():
            if key == "step":
                continue
            events = {event.step: event.value for event in accumulator.Scalars(metric_tag(key))}
            assert events[step] == pytest.approx(float(value), rel=1e-6), (key, step)
    assert {
        "reward/reward_mean",
        "train/loss",
        "time/time_generation_s",
        "train/clip_fraction",
        "eval/eval_pass_at_1",
    } <= tags
    assert [(e.step, e.value) for e in accumulator.Scalars("eval/eval_reward_mean")] == [
        (0, pytest.approx(0.1)),
        (3, pytest.approx(0.6)),
    ]


def test_wandb_offline_run_holds_the_history(reported):
    (run_dir,) = (reported["wandb_dir"] / "wandb").glob("offline-run-*")
    history = wandb_history(run_dir)
    by_step: dict[int, dict] = {}
    for row in history:
        by_step.setdefault(row["_step"], {}).update(row)
    assert sorted(by_step) == [0, 1, 2, 3]
    assert by_step[0]["eval/eval_reward_mean"] == 0.1
    for step in (1, 2, 3):
        assert by_step[step]["reward/reward_mean"] == pytest.approx(0.25 * step)
        assert by_step[step]["train/loss"] == pytest.approx(-0.01 * step)
        assert by_step[step]["time/time_sync_s"] == 0.5
    assert by_step[3]["eval/eval_pass_at_1"] == 0.5


def test_wandb_offline_makes_no_network_call(reported):
    assert reported["connections"] == 0


def test_api_key_canary_is_in_no_written_file_nor_console(reported, capfd):
    assert CANARY not in reported["console"]
    assert CANARY not in "".join(capfd.readouterr())
    files = [path for path in reported["root"].rglob("*") if path.is_file()]
    assert any(path.suffix == ".wandb" for path in files) and any("tfevents" in path.name for path in files)
    forms = [CANARY.encode(), base64.b64encode(CANARY.encode())]  # hex and dashes: JSON and URL escaping keep it plain
    leaked = [str(path) for path in files if any(form in path.read_bytes() for form in forms)]
    assert leaked == []


def test_console_shows_the_step_metrics(reported):
    text = reported["console"]
    assert "step 2/3" in text and "reward 0.500±0.500" in text and "pass 0.250" in text
    assert "loss -0.02" in text and "clip 0.030" in text and "gnorm 0.4" in text and "gen 3.0s" in text
    assert "groups 1/2" in text
    assert "eval @ step 0" in text and "pass@1 0.500" in text


def test_untrained_step_is_flagged_on_the_console(tmp_path):
    console = io.StringIO()
    options = LoggingOptions(console=True, tensorboard=False)
    with MetricsReporter(options, tmp_path, total_steps=2, console=Console(file=console, width=300)) as reporter:
        reporter.log(
            1,
            {
                "reward_mean": 1.0,
                "reward_std": 0.0,
                "groups_total": 2,
                "groups_zero_variance": 2,
                "groups_incomplete": 0,
                "trained": False,
            },
        )
    assert "no update" in console.getvalue() and "groups 0/2" in console.getvalue()
    assert not (tmp_path / "tensorboard").exists()


def test_refilled_step_shows_its_sampling_rounds(tmp_path):
    console = io.StringIO()
    options = LoggingOptions(console=True, tensorboard=False)
    with MetricsReporter(options, tmp_path, total_steps=2, console=Console(file=console, width=300)) as reporter:
        reporter.log(
            1,
            {
                "reward_mean": 0.4,
                "reward_std": 0.5,
                "groups_total": 5,
                "groups_zero_variance": 3,
                "groups_incomplete": 0,
                "sampling_rounds": 3,
                "trained": True,
            },
        )
        reporter.log(
            2,
            {
                "reward_mean": 0.5,
                "reward_std": 0.5,
                "groups_total": 2,
                "groups_zero_variance": 0,
                "groups_incomplete": 0,
                "sampling_rounds": 1,
                "trained": True,
            },
        )
    lines = console.getvalue().splitlines()
    assert "groups 2/5 in 3 rounds" in next(line for line in lines if "step 1/2" in line)
    assert "rounds" not in next(line for line in lines if "step 2/2" in line)  # one collection: nothing to say
    assert metric_tag("sampling_rounds") == "data/sampling_rounds"


def test_wandb_mode_resolution(tmp_path):
    no_login = {"NETRC": str(tmp_path / "absent_netrc")}
    assert resolve_wandb_mode(None, no_login) == "offline"
    assert resolve_wandb_mode(None, {**no_login, "WANDB_API_KEY": CANARY}) == "online"
    assert resolve_wandb_mode("offline", {**no_login, "WANDB_API_KEY": CANARY}) == "offline"
    assert resolve_wandb_mode(None, {**no_login, "WANDB_API_KEY": CANARY, "WANDB_MODE": "disabled"}) == "disabled"
    netrc_path = tmp_path / "netrc"
    netrc_path.write_text(f"machine api.wandb.ai\n  login user\n  password {CANARY}\n")
    netrc_path.chmod(0o600)
    assert resolve_wandb_mode(None, {"NETRC": str(netrc_path)}) == "online"  # a stored `wandb login`
    assert (
        resolve_wandb_mode(None, {"NETRC": str(netrc_path), "WANDB_BASE_URL": "https://wandb.example.com"}) == "offline"
    )


def test_online_wandb_run_id_survives_a_resume(tmp_path):
    first = persistent_wandb_run_id(tmp_path)
    assert len(first) == 8 and persistent_wandb_run_id(tmp_path) == first
    assert (tmp_path / "wandb_run_id").read_text() == first


def test_metric_tags_group_by_section():
    assert [
        metric_tag(k)
        for k in (
            "reward_std",
            "pass_rate",
            "advantage_max",
            "loss",
            "time_sync_s",
            "tokens_per_s",
            "groups_total",
            "eval_pass_at_1",
        )
    ] == [
        "reward/reward_std",
        "reward/pass_rate",
        "advantage/advantage_max",
        "train/loss",
        "time/time_sync_s",
        "time/tokens_per_s",
        "data/groups_total",
        "eval/eval_pass_at_1",
    ]


def test_quickstart_config_logging_block_validates():
    section = yaml.safe_load((REPO_ROOT / "configs/train/quickstart_grpo.yaml").read_text())["trainer"]
    cfg = TrainerConfig.model_validate(section)
    assert cfg.logging.console and cfg.logging.tensorboard and not cfg.logging.wandb.enabled
    with pytest.raises(ValueError):
        TrainerConfig.model_validate({**section, "logging": {"wandb": {"mode": "sometimes"}}})
