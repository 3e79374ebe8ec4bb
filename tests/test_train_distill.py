"""On-policy distillation (nemo_gym.train.distill): the advantage against hand-computed values, the teacher's
prompt_logprobs answer, and a tiny random student that moves toward a tiny random teacher. The teacher is served
over real HTTP on 127.0.0.1 by a stand-in for vLLM's `/v1/completions` (the external service) that computes the
prompt log-probs with the teacher model itself."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from fastapi import FastAPI  # noqa: E402
from live_servers import serve  # noqa: E402
from test_train_engine import make_tiny_model  # noqa: E402
from test_train_loop import PROMPT, rollout_row, sample_group  # noqa: E402

from nemo_gym.common.errors import ServerError  # noqa: E402
from nemo_gym.model_servers.teacher_scoring import parse_prompt_logprobs  # noqa: E402
from nemo_gym.train.batch import TrainingSequence, rollout_to_sequence  # noqa: E402
from nemo_gym.train.config import (
    EngineConfig,
    LossOptions,
    TeacherOptions,
    TrainerConfig,
    check_algorithm,
)  # noqa: E402
from nemo_gym.train.distill import (
    DistillEngine,
    OnPolicyDistillRecipe,
    TeacherClient,
    distill_advantages,
    distill_batch,
)  # noqa: E402


def test_advantage_is_the_negative_reverse_kl_sample():
    student = torch.tensor([[-0.5, -1.0, -3.0], [-2.0, -0.1, 0.0]])
    teacher = torch.tensor([[-2.0, -1.0, -0.5], [-0.5, -0.3, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # -(s - t): -(-0.5 + 2.0) = -1.5; -(-1.0 + 1.0) = 0; -(-3.0 + 0.5) = 2.5; -(-2.0 + 0.5) = 1.5; -(-0.1 + 0.3) = -0.2;
    # masked 0
    expected = torch.tensor([[-1.5, 0.0, 2.5], [1.5, -0.2, 0.0]])
    assert torch.allclose(distill_advantages(student, teacher, mask), expected)


def test_distill_batch_aligns_teacher_logprobs_on_targets():
    # tokens [7, 8, 9], prompt 7, generated 8 and 9 with sampler log-probs -1.0 and -2.0; the teacher gives
    # [None, -0.25, -3.0]: targets 8, 9 → A = [-(-1.0 + 0.25), -(-2.0 + 3.0)] = [0.75, -1.0]
    sequence = TrainingSequence([7, 8, 9], [0, 1, 1], [0.0, -1.0, -2.0])
    batch = distill_batch([sequence], [[None, -0.25, -3.0]])
    assert batch.token_advantages.tolist() == [[0.75, -1.0]]
    assert batch.select(slice(0, 1)).token_advantages.tolist() == [[0.75, -1.0]]
    with pytest.raises(ServerError, match="2 log-probs for a sequence of 3 tokens"):
        distill_batch([sequence], [[None, -0.25]])


def test_parse_prompt_logprobs():
    answer = {
        "choices": [
            {
                "prompt_logprobs": [
                    None,
                    {"8": {"logprob": -0.25, "rank": 1}},
                    {"9": {"logprob": -3.0, "rank": 4}, "5": {"logprob": -0.1, "rank": 1}},
                ]
            }
        ]
    }
    assert parse_prompt_logprobs(answer, [7, 8, 9]) == [None, -0.25, -3.0]
    with pytest.raises(ValueError, match="no entry for token 9"):
        parse_prompt_logprobs(
            {"choices": [{"prompt_logprobs": [None, {"8": {"logprob": -0.25}}, {"5": {"logprob": -0.1}}]}]}, [7, 8, 9]
        )
    with pytest.raises(ValueError, match="no choices"):
        parse_prompt_logprobs({"choices": [{"text": "x"}]}, [7, 8, 9])


def test_config_needs_a_teacher_for_on_distill():
    base = {"input_jsonl_fpath": "x.jsonl", "engine": {"model_path": "m"}}
    assert check_algorithm(TrainerConfig.model_validate({**base, "algorithm": "on_distill"}))[0].startswith(
        "trainer.teacher: algorithm on_distill needs a teacher"
    )
    assert (
        "only algorithm on_distill uses a teacher"
        in check_algorithm(TrainerConfig.model_validate({**base, "teacher": {"base_url": "http://127.0.0.1:1"}}))[0]
    )
    with pytest.raises(ValueError, match="exactly one of teacher.instance"):
        TeacherOptions(instance="a", base_url="http://127.0.0.1:1")
    trainer = OnPolicyDistillRecipe(
        TrainerConfig.model_validate({**base, "algorithm": "on_distill", "teacher": {"instance": "teacher_model"}}), []
    )
    assert trainer.cfg.loss.loss_type == "importance_sampling"  # the method's loss unless the config sets one


def test_setup_is_the_on_policy_one_with_a_teacher_on_rank_0(tmp_path, monkeypatch):
    """The recipe's set-up is `OnPolicyRecipe.setup` with its `DistillEngine` (rank 0: the gym, then its weight sync),
    and rank 0 alone also makes the teacher's client, to the config's teacher instance with the run's token."""
    from types import SimpleNamespace

    from nemo_gym.train import gym_connection

    made = []

    class FakeGym:
        def __init__(self, cfg, argv, out):
            self.eval_tasks, self.servers, self.connected = (
                [],
                SimpleNamespace(server_url=lambda name: f"http://127.0.0.1:1/{name}", head_url="http://h"),
                None,
            )
            made.append(self)

        def connect(self, engine):
            self.connected = engine

    class FakeEngine:
        def __init__(self, engine_config, loss_config, *, total_steps):
            self.loss_type = loss_config.loss_type

    monkeypatch.setattr(gym_connection, "GymConnection", FakeGym)
    monkeypatch.setattr("nemo_gym.train.distill.run_token_for_url", lambda url: "tok")
    cfg = TrainerConfig.model_validate(
        {
            "input_jsonl_fpath": "x.jsonl",
            "engine": {"model_path": "m"},
            "algorithm": "on_distill",
            "teacher": {"instance": "teacher_model"},
        }
    )
    assert OnPolicyDistillRecipe.engine_class is DistillEngine
    for is_main in (False, True):
        recipe = OnPolicyDistillRecipe(cfg, [])
        recipe.engine_class = FakeEngine
        recipe.setup(SimpleNamespace(is_main=is_main, out=tmp_path))
        assert isinstance(recipe.engine, FakeEngine) and recipe.engine.loss_type == "importance_sampling"
        assert (recipe.gym is not None, recipe.teacher is not None) == (is_main, is_main)
    assert len(made) == 1 and made[0].connected is recipe.engine
    assert recipe.teacher.url == "http://127.0.0.1:1/teacher_model" and recipe.teacher.headers == {
        "X-NG-Run-Token": "tok"
    }


def fake_vllm(model) -> FastAPI:
    """vLLM's /v1/completions with prompt_logprobs=0 (and /v1/models), computed by `model`."""
    app = FastAPI()

    @app.get("/v1/models")
    def models() -> dict:
        return {"data": [{"id": "teacher"}]}

    @app.post("/v1/completions")
    def completions(body: dict) -> dict:
        ids = body["prompt"]
        assert body["prompt_logprobs"] == 0 and body["model"] == "teacher" and body["max_tokens"] == 1
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].float(), -1)
        entries = [None] + [
            {str(t): {"logprob": logprobs[i, t].item(), "rank": 1, "decoded_token": "x"}} for i, t in enumerate(ids[1:])
        ]
        return {"choices": [{"text": "", "prompt_logprobs": entries}]}

    return app


def test_student_moves_toward_the_teacher(tmp_path):
    from transformers import AutoModelForCausalLM

    teacher_model = AutoModelForCausalLM.from_pretrained(
        make_tiny_model(tmp_path / "teacher", tie=False, seed=2)
    ).eval()
    with torch.no_grad():  # a confident teacher (random tiny models are near-uniform, so nearly equal to each other)
        teacher_model.lm_head.weight.mul_(10.0)
    engine = DistillEngine(
        EngineConfig(
            model_path=str(make_tiny_model(tmp_path / "student", seed=1)),
            learning_rate=5e-3,
            micro_batch_size=16,
            seed=0,
        ),
        LossOptions(loss_type="importance_sampling"),
        total_steps=8,
    )
    generator = torch.Generator().manual_seed(0)
    probe = torch.tensor([PROMPT + g for g in sample_group(engine.module, 8, 6, torch.Generator().manual_seed(99))[0]])

    def exact_kl() -> float:
        """Mean over the probe's positions of KL(student || teacher) over the whole vocabulary (no sampling noise)."""
        with torch.no_grad():
            student = torch.log_softmax(engine.module(input_ids=probe).logits.float(), -1)
            teacher = torch.log_softmax(teacher_model(input_ids=probe).logits.float(), -1)
        return (student.exp() * (student - teacher)).sum(-1).mean().item()

    kls = [exact_kl()]
    with serve(fake_vllm(teacher_model)) as url:
        client = TeacherClient(TeacherOptions(base_url=url), url)
        for _ in range(8):
            engine.module.eval()
            generations, log_probs = sample_group(engine.module, 16, 6, generator)
            sequences = [
                rollout_to_sequence(rollout_row(0, i, PROMPT, g, lp, 0.0))
                for i, (g, lp) in enumerate(zip(generations, log_probs))
            ]
            batch = distill_batch(
                sequences, client.score([s.input_ids for s in sequences]), pad_token_id=engine.pad_token_id
            )
            metrics = engine.train_step(batch)
            assert metrics["rollout_logprob_abs_diff_max"] < 1e-4  # trainer and sampler agree before the step
            kls.append(exact_kl())
    # seen: [1.259, 1.260, 1.256, 1.241, 1.230, 1.222, ..., 1.193]: a steady descent (with lr 2e-2 Adam's noisy steps
    # raise it instead, to 1.51, and this fails)
    assert kls[-1] < kls[4] < kls[0] and kls[-1] < 0.97 * kls[0], kls


def test_vllm_model_score_route_and_teacher_instance(tmp_path):
    """vllm_model attached (`base_url`) to the stand-in vLLM: `POST /score_token_ids` returns the teacher's log-probs,
    which TeacherClient reads as it does from a teacher instance of ng_run."""
    from live_servers import serve_vllm_model
    from transformers import AutoModelForCausalLM

    teacher_model = AutoModelForCausalLM.from_pretrained(make_tiny_model(tmp_path / "teacher", seed=2)).eval()
    ids = [1, 2, 3, 40, 41]
    with torch.no_grad():
        expected = torch.log_softmax(teacher_model(input_ids=torch.tensor([ids])).logits[0, :-1].float(), -1)
    expected = [expected[i, t].item() for i, t in enumerate(ids[1:])]
    with (
        serve(fake_vllm(teacher_model)) as vllm_url,
        serve_vllm_model({"entrypoint": "app.py", "base_url": vllm_url}, startup_timeout_s=60) as (url, _),
    ):
        [scored] = TeacherClient(TeacherOptions(instance="teacher_model"), url).score([ids])
        assert scored[0] is None and scored[1:] == pytest.approx(expected, abs=1e-6)
        import httpx

        assert (
            httpx.post(f"{url}/score_token_ids", json={"token_ids": [1]}).status_code == 422
        )  # a whole sequence: >= 2 ids
