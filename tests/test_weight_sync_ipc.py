"""The cuda_ipc weight sync on a CPU: everything but torch's two CUDA IPC calls.

- The layout: `plan_buckets` (worked examples of offsets and bucket cuts), its JSON, views of the buffer.
- The handle: torch's `reduce_tensor` arguments written as JSON and read back (bytes, dtypes, the allowed classes),
  a forged class refused, and the worker's `open_cuda_buffer` calling `rebuild_cuda_tensor` with its own device index
  (the rebuild faked: it needs CUDA).
- The worker's methods in-process (a buffer opened by a fake kind of handle; its bytes loaded by `model.load_weights`).
- Two processes over HTTP: a real `PolicyEngine` pushes with `CudaIpcWeightSync` into tests/weight_sync_receiver.py
  (vllm_model's own routes over the real extension), the buffer in POSIX shared memory instead of GPU memory: the
  receiver's weights then equal the engine's exactly, in one bucket and in several, and the prefix cache is reset
  once per push.
The CUDA calls themselves run in tests/test_gpu.py (`test_cuda_ipc_*`).
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

torch = pytest.importorskip("torch")

from nemo_gym.model_servers.engine_ext import weight_sync_worker as transport  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120
A = transport.TensorMeta("a", "bfloat16", (3, 5))  # 30 bytes
B = transport.TensorMeta("b", "float32", (4,))  # 16 bytes
C = transport.TensorMeta("c", "int64", ())  # 8 bytes


# -- layout ---------------------------------------------------------------------------------------------------
def test_plan_buckets_worked_examples():
    # one bucket: a at 0 (30 bytes), b at the next multiple of 256 after 30 = 256, c after 256 + 16 = 272 → 512
    assert transport.plan_buckets([A, B, C], 1 << 20) == [[(A, 0), (B, 256), (C, 512)]]
    assert transport.bucket_end([(A, 0), (B, 256), (C, 512)]) == 520
    # 300 bytes a bucket: c would end at 520 > 300, so it starts the second bucket at 0
    assert transport.plan_buckets([A, B, C], 300) == [[(A, 0), (B, 256)], [(C, 0)]]
    # a weight larger than a bucket gets one of its own
    big = transport.TensorMeta("big", "float32", (100,))  # 400 bytes
    assert transport.plan_buckets([A, big, C], 300) == [[(A, 0)], [(big, 0)], [(C, 0)]]


def test_layout_json_and_views():
    bucket = [(A, 0), (B, 256), (C, 512)]
    assert transport.layout_from_json(transport.layout_to_json(bucket)) == bucket
    with pytest.raises(ValueError, match="b: offset 100 is not a multiple of 256"):
        transport.layout_from_json('[["b", "float32", [4], 100]]')
    buffer = torch.zeros(520, dtype=torch.uint8)
    views = dict(transport.buffer_views(buffer, bucket))
    views["b"].copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert views["a"].shape == (3, 5) and views["a"].dtype == torch.bfloat16 and views["c"].shape == ()
    assert torch.equal(buffer[256:272].view(torch.float32), torch.tensor([1.0, 2.0, 3.0, 4.0]))  # a view, not a copy
    with pytest.raises(ValueError, match=r"c: bytes 512\.\.520 are past the shared buffer's 516"):
        list(transport.buffer_views(torch.zeros(516, dtype=torch.uint8), bucket))


# -- the handle ------------------------------------------------------------------------------------------------
def fake_reduce_args() -> tuple:
    """Arguments shaped as torch's reduce_tensor gives them for a CUDA tensor (rebuild_cuda_tensor's parameters)."""
    return (
        torch.Tensor,
        torch.Size([520]),
        (1,),
        0,
        torch.storage.TypedStorage,
        torch.uint8,
        0,
        b"\x00ipc\xff",
        520,
        0,
        False,
        b"/ref",
        4,
        b"evt",
        True,
    )


def test_handle_json_round_trip_and_forgeries(monkeypatch):
    from torch.multiprocessing import reductions

    names = list(inspect.signature(reductions.rebuild_cuda_tensor).parameters)
    assert len(names) == len(fake_reduce_args())
    handle = {"kind": "cuda", "args": {n: transport._encode(a) for n, a in zip(names, fake_reduce_args())}}
    text = json.dumps(handle)
    assert "\\u" not in text and "b64" not in text and '"bytes": "AGlwY/8="' in text  # base64, no pickle
    rebuilt = {}
    monkeypatch.setattr(
        reductions,
        "rebuild_cuda_tensor",
        lambda **kwargs: rebuilt.update(kwargs) or torch.zeros(520, dtype=torch.uint8),
    )
    buffer = transport.open_buffer(text, torch.device("cuda", 3))
    assert buffer.numel() == 520
    expected = dict(zip(names, fake_reduce_args()))
    assert rebuilt == {
        **expected,
        "tensor_size": tuple(expected["tensor_size"]),
        "storage_device": 3,
    }  # the worker's own index of the GPU
    forged = json.loads(text)
    forged["args"]["tensor_cls"] = {"class": "os.system"}
    with pytest.raises(KeyError, match="os.system"):
        transport.open_buffer(json.dumps(forged), torch.device("cuda", 0))
    with pytest.raises(ValueError, match="cannot share a builtins.dict by CUDA IPC"):
        transport._encode(dict)
    with pytest.raises(ValueError, match="shared buffer of kind 'nvlink': this worker opens cuda"):
        transport.open_buffer('{"kind": "nvlink"}', torch.device("cpu"))
    with pytest.raises(ValueError, match="share_cuda_buffer needs a CUDA tensor, not one on cpu"):
        transport.share_cuda_buffer(torch.zeros(4, dtype=torch.uint8))


# -- the worker's methods in-process --------------------------------------------------------------------------
def test_worker_opens_the_buffer_and_loads_views_of_it(monkeypatch):
    shared = torch.zeros(1024, dtype=torch.uint8)
    shared[:520].copy_(transport.probe_pattern(520))
    monkeypatch.setitem(transport.BUFFER_OPENERS, "test", lambda handle, device: shared)
    loaded = {}
    worker = transport.WeightSyncWorkerExtension()
    worker.rank, worker.device = 0, torch.device("cpu")
    worker.model_runner = SimpleNamespace(
        model=SimpleNamespace(load_weights=lambda weights: loaded.update({n: t.clone() for n, t in weights}))
    )
    answer = worker.weight_sync_worker_ipc_open('{"kind": "test"}')
    assert answer == {"rank": 0, "checksum": int(transport.probe_pattern(520).to(torch.int64).sum())}
    bucket = [(A, 0), (B, 256), (C, 512)]
    values = {"a": torch.randn(3, 5).to(torch.bfloat16), "b": torch.randn(4), "c": torch.tensor(7)}
    for name, view in transport.buffer_views(shared, bucket):
        view.copy_(values[name])
    answer = worker.weight_sync_worker_ipc_receive('{"kind": "test"}', transport.layout_to_json(bucket))
    assert answer["tensors"] == 3 and answer["bytes"] == 54
    assert all(torch.equal(loaded[name], values[name]) for name in values)
    worker.weight_sync_worker_close()
    assert worker._weight_sync_ipc is None


# -- two processes over HTTP, the buffer in host shared memory -------------------------------------------------
@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    from test_train_engine import make_tiny_model

    folder = tmp_path_factory.mktemp("models")
    return make_tiny_model(folder / "trainer", tie=False, seed=0), make_tiny_model(
        folder / "receiver", tie=False, seed=1
    )


@pytest.fixture
def receiver(models, tmp_path):
    port_file = tmp_path / "port.json"
    log = (tmp_path / "receiver.log").open("w")
    process = subprocess.Popen(
        [sys.executable, str(REPO / "tests/weight_sync_receiver.py"), str(models[1]), str(port_file)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "receiver.log").read_text()
            if port_file.exists() and port_file.read_text():
                url = f"http://127.0.0.1:{json.loads(port_file.read_text())['port']}"
                try:
                    httpx.post(f"{url}/weight_sync/workers", timeout=5)
                    break
                except httpx.TransportError:
                    pass
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(30)
        log.close()


@pytest.mark.long
@pytest.mark.integration
@pytest.mark.parametrize(("dtype", "bucket_bytes"), [("float32", 1 << 30), ("bfloat16", 1 << 30), ("float32", 40_000)])
def test_push_through_a_shared_buffer_makes_the_receivers_weights_the_engines(
    models, receiver, tmp_path, dtype, bucket_bytes
):
    pytest.importorskip("deepspeed")
    from safetensors.torch import load_file
    from test_train_engine import fixed_batch
    from weight_sync_receiver import HostBuffers

    from nemo_gym.train.config import EngineConfig, LossOptions
    from nemo_gym.train.engine import PolicyEngine
    from nemo_gym.train.weight_sync_direct import CudaIpcWeightSync

    engine = PolicyEngine(
        EngineConfig(model_path=str(models[0]), dtype=dtype, micro_batch_size=2, learning_rate=1e-2), LossOptions()
    )
    host = HostBuffers()
    sync = CudaIpcWeightSync(
        receiver, timeout_s=TIMEOUT_S, bucket_bytes=bucket_bytes, allocate=host.allocate, share=host.share
    )
    try:
        assert sync.connect(engine.device, check=False) == "cuda_ipc" and sync.buffer.numel() == transport.PROBE_BYTES
        for step in (1, 2):
            engine.train_step(fixed_batch())  # weights that neither starting model has
            answer = sync.push(engine, step=step)
            expected = engine.export_state_dict()
            assert answer["version"] == step and answer["tensors"] == len(expected)
            assert answer["bytes"] == sum(t.numel() * t.element_size() for t in expected.values())
            assert (answer["buckets"] > 1) == (bucket_bytes < 1 << 20)
            dumped = httpx.post(
                f"{receiver}/dump", json={"path": str(tmp_path / f"got{step}.safetensors")}, timeout=60
            ).json()
            got = load_file(str(tmp_path / f"got{step}.safetensors"))
            for name, tensor in expected.items():  # the receiver keeps float32: a bf16 value casts exactly
                assert torch.equal(got[name], tensor.float()), name
            assert dumped["resets"] == step  # one prefix-cache reset a push, after its last bucket
    finally:
        sync.close()
        host.unlink()
