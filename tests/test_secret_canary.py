"""Secrets never leave: canary secrets put in config, env.yaml and the environment appear 0 times,
plain or base64-, URL- or JSON-escaped, in any HTTP answer (error bodies and /openapi.json included), log,
rollout, failures or metrics file, checkpoint or exported metric, across ng_run start → collection with forced
errors → one training step → shutdown.

The secrets are used for real: the policy is an `openai_model` whose API key comes from env.yaml, in front of a
scripted model served here (which records the key it receives, so the sweep cannot pass vacuously); a second
`openai_model` (API key written in the config file) talks to an endpoint that rejects the key and echoes it back
in its error body, as some providers do; a third model fails every call (scripted_model `error_status`).
The run token of `ng_run` is swept as a secret too. Files meant to hold secrets (`instances.json`, `token`,
both 0600 in the run's state folder) and the env.yaml itself are not swept.

The training step is `ng_train` attached to the run, loading the same config, env.yaml and environment (plus
WANDB_API_KEY), with a tiny random model as the policy engine: the scripted policy returns the token information
vllm_model adds and calls the tool in every other episode only, so a group's rewards differ and the step is a real
optimizer step. Swept: its console output and every file under its output_dir (metrics.jsonl, rollouts,
checkpoints with trainer_state.json, final/, the TensorBoard events, the offline W&B run) and W&B's own folders.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import secrets
import subprocess
import urllib.parse
from collections.abc import Iterable
from pathlib import Path

import httpx
import pytest
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from live_servers import serve
from ng_process import BIN, REPO, NgRun, clean_env, weather_agent

from nemo_gym.common.jsonl import read_jsonl
from nemo_gym.model_servers.model_server import ModelServer
from nemo_gym.serving.auth import TOKEN_HEADER
from nemo_gym.serving.entrypoint import load_server_class
from nemo_gym.serving.head import live_runs, run_token_for_url, runs_dir

pytestmark = pytest.mark.integration

DATA = REPO / "resources_servers/example_single_tool_call/data/example.jsonl"
PROMPT_IDS, TOOL_CALL_IDS, TOOL_OUTPUT_IDS, REPLY_IDS = (
    [1, 2, 3],
    [20, 21],
    [40],
    [30, 31],
)  # below the tiny model's 512


def canary(name: str) -> str:
    """A unique secret whose URL, JSON and base64 forms all differ from the plain one."""
    return f'sk-canary-{name}-{secrets.token_hex(8)}/+&"='


def encodings(secret: str) -> dict[str, str]:
    """Forms in which a leaked secret could show up: its alphanumeric head (kept by every escaping, even nested
    JSON), the whole secret plain, URL-, JSON- and hex-encoded, and base64. Base64 is taken at the 3 alignments a secret
    can have inside
    a longer encoded text, without the edge characters that depend on its neighbours."""
    raw = secret.encode()
    core = re.match(r"[A-Za-z0-9_-]*", secret).group(0)  # unchanged by any escaping: catches doubly escaped copies too
    forms = {
        "plain": secret,
        **({"core": core} if len(core) >= 16 else {}),
        "url": urllib.parse.quote(secret, safe=""),
        "url_plus": urllib.parse.quote_plus(secret),
        "json": json.dumps(secret)[1:-1],
        "json_ascii_slash": json.dumps(secret)[1:-1].replace("/", "\\/"),
        "hex": raw.hex(),
    }
    for shift in range(3):
        for name, encode in [("base64", base64.b64encode), ("base64url", base64.urlsafe_b64encode)]:
            encoded = encode(b"\0" * shift + raw).decode()
            start = (shift * 4 + 2) // 3 + 1  # skip the characters that mix in the padding bytes
            forms[f"{name}@{shift}"] = encoded[start : start + (len(raw) * 4) // 3 - 4]
    return forms


def leaks(secrets_by_name: dict[str, str], texts: dict[str, str]) -> list[str]:
    """`where: secret (form)` for every occurrence of a secret, in any form, in `texts` ({where: text})."""
    found = []
    for secret_name, secret in secrets_by_name.items():
        for form, needle in encodings(secret).items():
            found += [f"{where}: {secret_name} ({form})" for where, text in texts.items() if needle in text]
    return found


def test_encodings_find_what_they_should():
    secret = canary("self-test")
    wrapped = {
        "a": json.dumps(json.dumps({"k": f"x{secret}y"})),
        "b": json.dumps({"k": secret}),
        "c": urllib.parse.urlencode({"k": secret}),
        "d": base64.b64encode(f"Bearer {secret}".encode()).decode(),
        "e": base64.b64encode(f"ab:{secret}".encode()).decode(),
        "f": base64.urlsafe_b64encode(f"q{secret}".encode()).decode(),
        "g": "nothing here",
    }
    assert sorted({w.split(":")[0] for w in leaks({"s": secret}, wrapped)}) == ["a", "b", "c", "d", "e", "f"]


def _trainable_policy(config: dict) -> ModelServer:
    """The scripted model with the training token information of vllm_model (`prompt_token_ids`, ...; each call's
    prompt extends the previous prompt + generation), which answers every other episode at once instead of calling
    the tool: in a group of 2, one rollout gets reward 1 and the other 0, so ng_train takes an optimizer step."""
    first_turns = itertools.count()

    class TrainablePolicy(load_server_class(REPO / "responses_api_models/scripted_model/app.py")):
        async def responses(self, body: dict) -> dict:
            followup = any(
                isinstance(item, dict) and item.get("type") == "function_call_output"
                for item in body.get("input") or []
            )
            if not followup and next(first_turns) % 2:
                body = {**body, "tools": []}  # no tool offered: the scripted model answers with text
            answer = await super().responses(body)
            generation = TOOL_CALL_IDS if answer["output"][-1]["type"] == "function_call" else REPLY_IDS
            prompt = PROMPT_IDS + TOOL_CALL_IDS + TOOL_OUTPUT_IDS if followup else PROMPT_IDS
            answer["output"][-1].update(
                prompt_token_ids=prompt, generation_token_ids=generation, generation_log_probs=[-6.0] * len(generation)
            )
            return answer

    return TrainablePolicy(config)


def _rejecting_endpoint(seen: list[str]) -> FastAPI:
    """An OpenAI-compatible endpoint that refuses every key and echoes it in its 401 body."""
    app = FastAPI()

    @app.post("/v1/responses")
    async def responses(request: Request) -> JSONResponse:
        key = request.headers.get("authorization", "")
        seen.append(key)
        return JSONResponse(
            {"error": {"message": f"Incorrect API key provided: {key}", "type": "invalid_request_error"}},
            status_code=401,
        )

    return app


def _config(path: Path, upstream_url: str, rejecting_url: str, config_secret: str) -> None:
    model = lambda url, key: {
        "responses_api_models": {
            "openai_model": {  # noqa: E731
                "entrypoint": "app.py",
                "openai_base_url": f"{url}/v1",
                "openai_api_key": key,
                "openai_model": "scripted",
                "max_retries": 0,
            }
        }
    }
    config = {
        "weather": {"resources_servers": {"example_single_tool_call": {"entrypoint": "app.py"}}},
        "weather_agent": weather_agent("policy_model"),
        "rejected_agent": weather_agent("rejecting_model"),
        "failing_agent": weather_agent("failing_model"),
        "policy_model": model(upstream_url, "${policy_api_key}"),
        "rejecting_model": model(rejecting_url, "${judge_api_key}"),
        "failing_model": {"responses_api_models": {"scripted_model": {"entrypoint": "app.py", "error_status": 500}}},
        "judge_api_key": config_secret,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def _answers(head: str, token: str) -> dict[str, str]:
    """Text and headers of every answer of every server: routes read with and without the token, error bodies."""
    auth = {TOKEN_HEADER: token}
    texts: dict[str, str] = {}
    with httpx.Client(timeout=60, trust_env=False) as http:

        def keep(where: str, answer: httpx.Response) -> None:
            texts[where] = f"{answer.status_code} {dict(answer.headers)} {answer.text}"

        servers = http.get(f"{head}/servers", headers=auth).json()
        for path in ["/health", "/servers", "/openapi.json", "/docs", "/servers/policy_model", "/servers/nope"]:
            keep(f"head {path}", http.get(f"{head}{path}", headers=auth))
            keep(f"head {path} (no token)", http.get(f"{head}{path}"))
        row = json.loads(DATA.read_text().splitlines()[0])
        chat = {"messages": [{"role": "user", "content": "weather?"}]}
        for server in servers:
            name, url = server["name"], server["url"]
            for path in ["/health", "/openapi.json", "/tools", "/v1/models", "/row_schema", "/nope"]:
                keep(f"{name} GET {path}", http.get(f"{url}{path}", headers=auth))
                keep(f"{name} GET {path} (no token)", http.get(f"{url}{path}"))
            for path, body in [
                ("/run", row),
                ("/v1/responses", row["responses_create_params"]),
                ("/v1/chat/completions", chat),
                ("/verify", {"responses_create_params": {}, "response": {"output": []}}),
                ("/run", {"bad": 1}),
            ]:
                keep(f"{name} POST {path}", http.post(f"{url}{path}", json=body, headers=auth))
            keep(
                f"{name} POST bad json",
                http.post(
                    f"{url}/v1/responses", content=b"{not json", headers={**auth, "content-type": "application/json"}
                ),
            )
            keep(f"{name} POST with a wrong token", http.post(f"{url}/run", json=row, headers={TOKEN_HEADER: "wrong"}))
    return texts


def _collect(head: str, agent: str, out: Path) -> str:
    command = [
        str(BIN / "ng_collect_rollouts"),
        f"+head_server_url={head}",
        f"+agent_name={agent}",
        f"+input_jsonl_fpath={DATA}",
        f"+output_jsonl_fpath={out}",
        "+progress=false",
        "+max_retries=1",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    return f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"


def _train(args: list[str], head: str, out: Path, model: Path, environment: dict[str, str]) -> str:
    """One GRPO step of `ng_train` attached to the run (its config, env.yaml and environment), every sink on;
    returns its exit status and console output."""
    command = [
        str(BIN / "ng_train"),
        *args,
        f"+trainer.head_server_url={head}",
        f"+trainer.input_jsonl_fpath={DATA}",
        "+trainer.agent_name=weather_agent",
        f"+trainer.output_dir={out}",
        "+trainer.num_steps=1",
        "+trainer.batch_size=1",
        "+trainer.group_size=2",
        f"+trainer.engine.model_path={model}",
        "+trainer.sync_weights=false",
        "+trainer.logging.console=true",
        "+trainer.logging.tensorboard=true",
        "+trainer.logging.wandb.enabled=true",
        "+trainer.logging.wandb.mode=offline",
    ]
    env = clean_env() | environment
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600, env=env, check=False)
    return f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"


def _files(paths: Iterable[Path]) -> dict[str, str]:
    return {str(p): p.read_text(errors="replace") for p in paths if p.is_file()}


@pytest.mark.long
def test_canary_secrets_never_leave(tmp_path):
    pytest.importorskip("deepspeed", reason="the sweep includes a training step: pip install 'nemo-gym[train]'")
    from test_train_engine import make_tiny_model

    canaries = {
        "env_yaml": canary("envyaml"),
        "config_file": canary("config"),
        "environment": canary("environ"),
        "wandb": canary("wandb"),
    }
    seen_by_upstream: list[str] = []
    upstream = _trainable_policy({"default_reply": "It is cold in San Francisco."})

    upstream_app = upstream.build_app()

    @upstream_app.middleware("http")
    async def record_key(request: Request, call_next):
        seen_by_upstream.append(request.headers.get("authorization", ""))
        return await call_next(request)

    env_yaml, config = tmp_path / "env.yaml", tmp_path / "canary.yaml"
    env_yaml.write_text(yaml.safe_dump({"policy_api_key": canaries["env_yaml"]}))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    texts: dict[str, str] = {}
    environment = {
        "OPENAI_API_KEY": canaries["environment"],
        "HF_TOKEN": canaries["environment"],
        "NEMO_GYM_CANARY_SECRET": canaries["environment"],
    }
    train_dir, wandb_home = tmp_path / "train", tmp_path / "wandb_home"
    train_environment = {
        **environment,
        "WANDB_API_KEY": canaries["wandb"],
        "WANDB_ERROR_REPORTING": "false",
        **{
            name: str(wandb_home / name.lower())
            for name in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR")
        },
    }

    with serve(upstream_app) as upstream_url, serve(_rejecting_endpoint(seen_by_upstream)) as rejecting_url:
        _config(config, upstream_url, rejecting_url, canaries["config_file"])
        args = [f"+config_paths=[{config}]", f"+env_yaml_fpath={env_yaml}", "+skip_venv=true"]
        dump = subprocess.run(
            [str(BIN / "ng_dump_config"), *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **environment},
        )
        assert dump.returncode == 0, dump.stderr
        texts["ng_dump_config"] = dump.stdout + dump.stderr

        with NgRun(*args, env=environment) as run:
            head = run.wait_ready()
            token = run_token_for_url(head)
            assert token
            run_dir = runs_dir() / next(r["run_id"] for r in live_runs() if r["head_url"] == head)
            texts.update(_answers(head, token))
            for agent in ["weather_agent", "rejected_agent", "failing_agent"]:
                texts[f"ng_collect_rollouts {agent}"] = _collect(head, agent, out_dir / f"{agent}.jsonl")
            texts["ng_status"] = subprocess.run(
                [str(BIN / "ng_status"), "+json=true", f"+head_server_url={head}"],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout
            texts["ng_train"] = _train(args, head, train_dir, make_tiny_model(tmp_path / "tiny"), train_environment)
            assert run.stop() == 0
        texts["ng_run output"] = run.output()

    # the secrets were really used: the endpoints got the keys, the collections ran and failed as scripted
    assert (
        f"Bearer {canaries['env_yaml']}" in seen_by_upstream and f"Bearer {canaries['config_file']}" in seen_by_upstream
    )
    assert "Rollouts: 5/5" in texts["ng_collect_rollouts weather_agent"]
    failures = {agent: out_dir / f"{agent}_failures.jsonl" for agent in ["rejected_agent", "failing_agent"]}
    assert all(len(path.read_text().splitlines()) == 5 for path in failures.values()), {
        a: p.read_text()[:500] for a, p in failures.items()
    }
    assert (
        "Incorrect API key provided" in failures["rejected_agent"].read_text()
    )  # the echoed error reached the failures file, redacted

    # the training step ran through and stepped: a trained step, its checkpoint, the final model, every sink's files
    assert texts["ng_train"].startswith("exit 0\n"), texts["ng_train"][-6000:]
    (step,) = read_jsonl(train_dir / "metrics.jsonl")
    assert step["trained"] is True and step["reward_mean"] == 0.5, step
    assert (train_dir / "checkpoints" / "latest_step").read_text() == "step_000001"
    assert (train_dir / "checkpoints" / "step_000001" / "trainer_state.json").is_file() and (
        train_dir / "final" / "model.safetensors"
    ).is_file()
    assert list((train_dir / "tensorboard").glob("events.out.tfevents.*")) and list(
        (train_dir / "wandb").glob("offline-run-*/run-*.wandb")
    )

    texts.update(_files(sorted(out_dir.iterdir())))
    texts.update(_files(sorted((run_dir / "logs").iterdir())))
    texts.update(_files(sorted(train_dir.rglob("*"))))
    texts.update(_files(sorted(wandb_home.rglob("*"))))
    assert not (run_dir / "token").exists()
    assert leaks({**canaries, "run_token": token}, texts) == []
