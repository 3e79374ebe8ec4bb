"""Trainer resume is exact after a SIGKILL anywhere.

`ng_train` runs as a real subprocess (its own session, so SIGKILL takes its whole process group) on the tiny
random-weight model, attached to a real `ng_run` of the weather environment whose policy is a deterministic
scripted model with training token information (`KillablePolicy`, served in this process). One run goes
through uninterrupted; a second run on another output_dir is killed again and again, each time resumed with
`+trainer.resume=true`:

    mid-rollout          the policy server itself SIGKILLs the trainer's group while answering a call of step 2
    backward@3           after the first micro-batch's backward of step 3 (the `nemo_gym.train.crash_points` hook)
    optimizer_step@3     right after AdamW updated the weights in memory, before the LR schedule advanced
    checkpoint_file@3    inside DeepSpeed's checkpoint write, after its first file: step_000003/ is torn
    checkpoint_state@4   after the DeepSpeed files and trainer_state.json, before rng_state.pt and latest_step
    random ×2            a random time after a random model call of the remaining work (seeded: NG_KILL_SEED)

then resumed once more to the end. After every kill, `latest_step` names a complete checkpoint (the torn folders
are skipped: the next resume says which one it took). At the end, every checkpoint step_000001..N of the killed
run equals the uninterrupted run's: parameters, AdamW moments and step counts, LR schedule state, DeepSpeed's
counters (torch.equal on every tensor), the trainer state (step, data position), the RNG states (torch and
Python: the same draws follow), and every step's task batch (data order) and metrics.

Determinism: rollouts are collected one at a time (`num_samples_in_parallel=1`, so the rollouts file is in
dispatch order) and the policy's script restarts with every launch (as a policy served by the trainer would).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from live_servers import serve
from ng_process import BIN, REPO, NgRun, clean_env, weather_config

from nemo_gym.serving.entrypoint import load_server_class

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from test_train_engine import make_tiny_model  # noqa: E402

from nemo_gym.train.safe_checkpoint import safe_torch_load  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.chaos, pytest.mark.slow]

DATA = REPO / "resources_servers/example_single_tool_call/data/example.jsonl"
PROMPT_IDS, TOOL_CALL_IDS, TOOL_OUTPUT_IDS, REPLY_IDS = (
    [1, 2, 3],
    [20, 21],
    [40],
    [30, 31],
)  # below the tiny model's 512
NUM_STEPS = 5
CALLS_PER_STEP = 6  # 2 tasks x 2 rollouts; the rollout that calls the tool makes 2 model calls, the other 1
RANDOM_SEED = int(os.environ.get("NG_KILL_SEED", "8"))


class KillablePolicy:
    """The scripted policy with vLLM's training token information; in each group of 2 (collected one after the
    other), the first rollout calls the weather tool (reward 1) and the second answers at once (reward 0).

    `restart(pgid, kill_on_call, kill_after_s)` starts the script over for a new trainer process; with
    `kill_on_call`, the call with that number (1-based) SIGKILLs the process group `pgid`: before it is answered
    (a kill mid-rollout), or `kill_after_s` seconds later, wherever the trainer then is.
    """

    def __init__(self) -> None:
        self.first_turns = 0
        self.calls = 0
        self.pgid: int | None = None
        self.kill_on_call: int | None = None
        self.kill_after_s = 0.0
        self.killed = threading.Event()
        policy = self

        class Policy(load_server_class(REPO / "responses_api_models/scripted_model/app.py")):
            async def responses(self, body: dict) -> dict:
                policy.calls += 1
                if policy.calls == policy.kill_on_call and policy.pgid:
                    if policy.kill_after_s:
                        threading.Timer(policy.kill_after_s, policy.kill, args=(policy.pgid,)).start()
                    else:
                        policy.kill(policy.pgid)
                followup = any(
                    isinstance(item, dict) and item.get("type") == "function_call_output"
                    for item in body.get("input") or []
                )
                if not followup:
                    policy.first_turns += 1
                    if policy.first_turns % 2 == 0:
                        body = {**body, "tools": []}  # no tool offered: the scripted model answers with text
                answer = await super().responses(body)
                generation = TOOL_CALL_IDS if answer["output"][-1]["type"] == "function_call" else REPLY_IDS
                prompt = PROMPT_IDS + TOOL_CALL_IDS + TOOL_OUTPUT_IDS if followup else PROMPT_IDS
                answer["output"][-1].update(
                    prompt_token_ids=prompt,
                    generation_token_ids=generation,
                    generation_log_probs=[-6.0] * len(generation),
                )
                return answer

        self.app = Policy({"default_reply": "It is cold in San Francisco."}).build_app()

    def restart(self, pgid: int, kill_on_call: int | None = None, kill_after_s: float = 0.0) -> None:
        self.first_turns = self.calls = 0
        self.pgid, self.kill_on_call, self.kill_after_s = pgid, kill_on_call, kill_after_s
        self.killed.clear()

    def kill(self, pgid: int) -> None:
        try:
            os.killpg(pgid, signal.SIGKILL)
            self.killed.set()
        except ProcessLookupError:  # it had ended already
            pass


class Trainer:
    """Launches of `ng_train` for one output_dir, each in its own session (process group)."""

    def __init__(self, config: Path, head_url: str, model: Path, out: Path, policy: KillablePolicy):
        self.out, self.policy, self.launches = out, policy, 0
        self.argv = [
            str(BIN / "ng_train"),
            f"+config_paths=[{config}]",
            "+skip_venv=true",
            f"+trainer.head_server_url={head_url}",
            f"+trainer.input_jsonl_fpath={DATA}",
            "+trainer.agent_name=weather_agent",
            f"+trainer.output_dir={out}",
            f"+trainer.num_steps={NUM_STEPS}",
            "+trainer.batch_size=2",
            "+trainer.group_size=2",
            "+trainer.num_samples_in_parallel=1",
            f"+trainer.engine.model_path={model}",
            "+trainer.engine.micro_batch_size=2",
            "+trainer.engine.learning_rate=0.01",
            "+trainer.checkpoint_interval=1",
            "+trainer.sync_weights=false",
            "+trainer.logging.console=false",
            "+trainer.logging.tensorboard=false",
        ]

    def start(
        self, *, resume: bool, crash_at: str | None = None, kill_on_call: int | None = None, kill_after_s: float = 0.0
    ) -> tuple[subprocess.Popen, Path]:
        self.launches += 1
        log = self.out.parent / f"{self.out.name}_launch{self.launches}.log"
        env = clean_env() | ({"NEMO_GYM_CRASH_AT": crash_at} if crash_at else {})
        with log.open("wb") as handle:
            process = subprocess.Popen(
                [*self.argv, f"+trainer.resume={str(resume).lower()}"],
                cwd=REPO,
                env=env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.policy.restart(process.pid, kill_on_call, kill_after_s)
        return process, log

    def run(self, *, resume: bool, timeout_s: float = 240, **kill: Any) -> tuple[int, str]:
        process, log = self.start(resume=resume, **kill)
        try:
            returncode = process.wait(timeout_s)
        finally:
            kill_group(process)
        return returncode, log.read_text(errors="replace")


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the process group of `process` (its session) if anything of it is left; reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(30)


def latest(out: Path) -> str:
    return (out / "checkpoints" / "latest_step").read_text()


def assert_complete(out: Path, tag: str) -> None:
    folder = out / "checkpoints" / tag
    assert (folder / "trainer_state.json").is_file() and (folder / "rng_state.pt").is_file(), sorted(
        p.name for p in folder.iterdir()
    )
    assert (folder / "mp_rank_00_model_states.pt").is_file()


def assert_same(a: Any, b: Any, where: str) -> None:
    """a == b, tensors by torch.equal (and dtype), containers element by element; `where` names the place."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (
            f"{where}: keys {sorted(map(str, a))} != {sorted(map(str, b))}"
        )
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif type(a).__eq__ is object.__eq__ and hasattr(a, "__dict__"):  # e.g. argparse.Namespace-like records: by field
        assert type(a) is type(b), where
        assert_same(vars(a), vars(b), f"{where}.__dict__")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def assert_checkpoints_equal(reference: Path, resumed: Path) -> None:
    for step in range(1, NUM_STEPS + 1):
        tag = f"step_{step:06d}"
        ref, got = reference / "checkpoints" / tag, resumed / "checkpoints" / tag
        files = sorted(
            p.name for p in ref.iterdir() if not p.name.startswith(".")
        )  # not the temporary files of a killed write
        assert files == sorted(p.name for p in got.iterdir() if not p.name.startswith(".")), tag
        for name in files:
            if name.endswith(".pt"):
                assert_same(safe_torch_load(str(ref / name)), safe_torch_load(str(got / name)), f"{tag}/{name}")
            elif name.endswith(".json"):
                assert json.loads((ref / name).read_text()) == json.loads((got / name).read_text()), f"{tag}/{name}"
        states = safe_torch_load(str(got / "mp_rank_00_model_states.pt"))
        moments = states["optimizer"]["state"]
        assert moments and all(torch.count_nonzero(m["exp_avg"]) for m in moments.values()), (
            f"{tag}: AdamW moments were compared, and are not all zero"
        )


def step_rows(out: Path) -> dict[int, dict]:
    """The last metrics line of each step (a step redone after a kill is logged again), without the wall-clock
    `time` and the durations."""
    rows = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows[row["step"]] = {
            k: v for k, v in row.items() if k not in ("time", "tokens_per_s") and not k.startswith("time_")
        }
    return rows


def test_trainer_killed_anywhere_resumes_exactly(tmp_path):
    model = make_tiny_model(tmp_path / "tiny", seed=5)
    policy = KillablePolicy()
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    with (
        serve(policy.app) as policy_url,
        NgRun(f"+config_paths=[{weather_config(tmp_path / 'config.yaml', policy_url)}]", "+skip_venv=true") as run,
    ):
        head, config = run.wait_ready(), tmp_path / "config.yaml"
        whole = Trainer(config, head, model, reference, policy)
        returncode, text = whole.run(resume=False)
        assert returncode == 0, text[-4000:]
        assert all(row["trained"] for row in step_rows(reference).values()), step_rows(reference)

        chain = Trainer(config, head, model, killed, policy)
        # mid-rollout: the policy kills the trainer while answering the 2nd model call of step 2
        returncode, text = chain.run(resume=False, kill_on_call=CALLS_PER_STEP + 2)
        assert policy.killed.is_set() and returncode == -signal.SIGKILL, text[-4000:]
        assert latest(killed) == "step_000001" and not (killed / "checkpoints" / "step_000002").exists()

        for crash_at, expected_latest, torn in [
            ("backward@3", "step_000002", None),
            ("optimizer_step@3", "step_000002", None),
            ("checkpoint_file@3", "step_000002", "step_000003"),
            ("checkpoint_state@4", "step_000003", "step_000004"),
        ]:
            before = latest(killed)
            returncode, text = chain.run(resume=True, crash_at=crash_at)
            assert returncode == -signal.SIGKILL and f"NEMO_GYM_CRASH_AT={crash_at}: SIGKILL now" in text, text[-4000:]
            assert f"resumed from {killed / 'checkpoints' / before} at step {int(before[5:])}" in text, text[
                -4000:
            ]  # the torn folder before was skipped
            assert latest(killed) == expected_latest, crash_at
            assert_complete(killed, expected_latest)
            if torn:
                assert (killed / "checkpoints" / torn).is_dir() and not (
                    killed / "checkpoints" / torn / "rng_state.pt"
                ).exists(), crash_at

        rng = random.Random(RANDOM_SEED)
        for trial in range(2):  # at a random point of the remaining work: a random model call, then a random delay
            remaining_calls = CALLS_PER_STEP * (NUM_STEPS - int(latest(killed)[5:]))
            call, delay_s = rng.randint(1, remaining_calls), rng.uniform(0.0, 0.5)
            returncode, text = chain.run(resume=True, kill_on_call=call, kill_after_s=delay_s)
            where = (
                f"random kill {trial} (NG_KILL_SEED={RANDOM_SEED}: {delay_s:.2f} s after model call {call} of"
                f" {remaining_calls})"
            )
            assert returncode in (0, -signal.SIGKILL), f"{where}: {text[-4000:]}"
            assert_complete(killed, latest(killed))
            print(f"{where}: exit {returncode}, latest checkpoint {latest(killed)}")

        returncode, text = chain.run(resume=True)
        assert returncode == 0, text[-4000:]
        assert run.stop() == 0

    assert latest(killed) == latest(reference) == f"step_{NUM_STEPS:06d}"
    assert_checkpoints_equal(reference, killed)
    assert step_rows(killed) == step_rows(reference)
    for step in range(1, NUM_STEPS + 1):  # data order: each step took the same tasks
        name = f"rollouts/step_{step:06d}_tasks.jsonl"
        assert (killed / name).read_text() == (reference / name).read_text(), name
