"""A team's run server (`ng_serve`, `nemo_gym.team.command`): an HTTP API (FastAPI) in front of a Ray cluster's job
submission.

API (every route but `GET /health` needs `Authorization: Bearer <token>`; a missing, unknown, expired or revoked
token gets 401 `{"detail": "unauthorized"}`, the same body whatever the reason):

  GET    /v1/me                                  {user, orgs}
  POST   /v1/orgs/{org}/uploads                  body: a .tar.gz of the project folder -> {upload_id}
  POST   /v1/orgs/{org}/runs                     {kind: train|collect, args: [...], upload_id} -> run (201)
  GET    /v1/orgs/{org}/runs                     [run, ...] newest first
  GET    /v1/orgs/{org}/runs/{id}                run: {id, org, user, kind, args, status, message, created, ...}
  GET    /v1/orgs/{org}/runs/{id}/logs?follow=   text/plain; with follow=true streamed until the run ends
  POST   /v1/orgs/{org}/runs/{id}/stop           {save_model} -> run (the stop is asynchronous: poll the run)
  DELETE /v1/orgs/{org}/runs/{id}?force=         204 (a running run needs force=true)
  GET    /v1/orgs/{org}/runs/{id}/model          the run's final/ folder as a tar stream (once it has ended)
  GET    /v1/orgs/{org}/models                   the organization's stored models

Once a training run has ended, the server copies its final/ folder (if it left one) from the run's node into its
storage (checked every `harvest_interval_s`; a download of a run not yet copied fetches it at once).

Organizations are namespaces: an organization the user is not a member of, and a run, upload or model of another
organization, answer 404 `{"detail": "not found"}` exactly as one that does not exist. Storage: `<data_dir>/`
(0700) holds `serve.db` (0600, nemo_gym.team.store), `ray_auth_token` (0600, a local head's Ray token) and
`orgs/<org>/{uploads,models}/` (models: `<run id>.tar`, the final/ folder fetched from the run's node).

What the isolation covers: the API. A run's code executes on the cluster's nodes as the user who started Ray, like
any Ray job, so organizations that must not trust each other's code need separate clusters (and servers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import tarfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from nemo_gym.common.errors import NemoGymError
from nemo_gym.config import MASK, is_secret_key
from nemo_gym.runs.background import new_run_id
from nemo_gym.team.backend import TERMINAL, RayBackend, ray_status_to_run_status
from nemo_gym.team.job import RUN_ID_PATTERN
from nemo_gym.team.store import Run, Store, User

__all__ = ["SubmitRequest", "StopRequest", "build_app", "mask_secret_args", "private_dir"]

log = logging.getLogger("nemo_gym.serving.entrypoint")
UPLOAD_ID_BYTES = 12


class SubmitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["train", "collect"] = Field(description="train: ng_train; collect: ng_collect_rollouts")
    args: list[str] = Field(default_factory=list, max_length=500, description="the command's +key=value arguments")
    upload_id: str = Field(
        description="the project folder uploaded with POST /v1/orgs/{org}/uploads (the job's working directory)"
    )


class StopRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    save_model: bool = Field(False, description="the trainer writes final/ before it exits")


def _not_found() -> HTTPException:
    return HTTPException(status_code=404, detail="not found")


def private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


@dataclass
class _ModelStorage:
    """The final models of ended training runs, kept in `<storage>/<org>/models/<run id>.tar` (each fetched from its
    node once: `fetched` holds the runs whose model was fetched or found missing)."""

    store: Store
    backend: RayBackend
    storage_dir: Path
    fetched: set[str] = field(default_factory=set)

    def path(self, run: Run) -> Path:
        return self.storage_dir / run.org_id / "models" / f"{run.id}.tar"

    def fetch(self, run: Run, job: Any | None) -> bool:
        """Copy the ended run's final/ from its node into storage; whether there is one now."""
        path = self.path(run)
        if not path.is_file() and run.id not in self.fetched:
            data = self.backend.fetch_final(run.id, getattr(job, "driver_node_id", None))
            if data is not None:
                _write_private_file(private_dir(path.parent), path, data)
            self.fetched.add(run.id)
        return path.is_file()

    def harvest(self) -> None:
        """Fetch the model of every ended training run not fetched yet."""
        jobs = self.backend.jobs()
        for run in self.store.all_runs():
            job = jobs.get(run.submission_id)
            if run.kind == "train" and job is not None and ray_status_to_run_status(job.status) in TERMINAL:
                try:
                    self.fetch(run, job)
                except NemoGymError as exc:
                    log.warning("run %s: model not copied: %s", run.id, exc)

    def describe(self, run: Run, job: Any | None) -> dict[str, Any]:
        """A run as the API answers it (secret arguments masked)."""
        return {
            "id": run.id,
            "org": run.org_id,
            "user": run.user_id,
            "kind": run.kind,
            "args": mask_secret_args(run.args),
            "status": ray_status_to_run_status(job.status) if job is not None else "unknown",
            "message": getattr(job, "message", None),
            "created": run.created_at,
            "started_at": _seconds(getattr(job, "start_time", None)),
            "ended_at": _seconds(getattr(job, "end_time", None)),
            "returncode": getattr(job, "driver_exit_code", None),
            "stop_requested": run.stop_requested,
            "save_model": run.save_model,
            "model_stored": self.path(run).is_file(),
        }


def build_app(
    store: Store, backend: RayBackend, storage_dir: Path, *, max_upload_bytes: int, harvest_interval_s: float = 10.0
) -> FastAPI:
    """The run server's app. `backend` is a started RayBackend (tests pass a fake with the same methods);
    `harvest_interval_s` (0: never) is how often ended training runs' models are copied into storage."""
    models = _ModelStorage(store, backend, storage_dir)
    app = FastAPI(
        title="nemo_gym run server",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=_harvesting(models, harvest_interval_s),
    )

    @app.exception_handler(NemoGymError)
    async def _nemo_gym_error(request: Request, exc: NemoGymError) -> JSONResponse:
        return JSONResponse(status_code=502, content={"detail": str(exc)})

    user_of, member = _authentication(store)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/me")
    def me(user: User = Depends(user_of)) -> dict[str, Any]:
        return {"user": user.id, "orgs": list(user.orgs)}

    _add_upload_route(app, member, storage_dir, max_upload_bytes)
    _add_run_routes(app, member, models)
    _add_run_control_routes(app, member, models)
    _add_model_routes(app, member, models)
    return app


def _harvesting(
    models: _ModelStorage, interval_s: float
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """The app's lifespan: `models.harvest()` every `interval_s` seconds (never when 0)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def loop() -> None:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    await run_in_threadpool(models.harvest)
                except Exception:  # noqa: BLE001  (Ray unreachable for a moment: try again next time)
                    log.exception("model harvest failed")

        task = asyncio.create_task(loop()) if interval_s > 0 else None
        yield
        if task is not None:
            task.cancel()

    return lifespan


def _authentication(store: Store) -> tuple[Callable[..., User], Callable[..., tuple[str, User]]]:
    """The dependencies `user_of` (the bearer token's user, else 401) and `member` (org, user of a member of the
    path's organization, else 404)."""

    def user_of(request: Request) -> User:
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header[:7].lower() == "bearer " else None
        user = store.authenticate(token)
        if user is None:
            raise HTTPException(status_code=401, detail="unauthorized", headers={"WWW-Authenticate": "Bearer"})
        return user

    def member(org: str, user: User = Depends(user_of)) -> tuple[str, User]:
        if org not in user.orgs:
            raise _not_found()
        return org, user

    return user_of, member


def _run_of(store: Store, org_user: tuple[str, User], run_id: str) -> Run:
    run = store.get_run(org_user[0], run_id) if RUN_ID_PATTERN.match(run_id) else None
    if run is None:
        raise _not_found()
    return run


def _add_upload_route(
    app: FastAPI, member: Callable[..., tuple[str, User]], storage_dir: Path, max_upload_bytes: int
) -> None:
    @app.post("/v1/orgs/{org}/uploads", status_code=201)
    async def upload(request: Request, org_user: tuple[str, User] = Depends(member)) -> dict[str, str]:
        upload_id = secrets.token_hex(UPLOAD_ID_BYTES)
        uploads = private_dir(storage_dir / org_user[0] / "uploads")
        archive = uploads / f"{upload_id}.tar.gz"
        received = 0
        with archive.open("wb") as handle:
            async for chunk in request.stream():
                received += len(chunk)
                if received > max_upload_bytes:
                    handle.close()
                    archive.unlink(missing_ok=True)
                    raise HTTPException(
                        status_code=413,
                        detail=f"upload larger than {max_upload_bytes / 2**20:.0f} MiB (ng_serve +max_upload_mb)",
                    )
                handle.write(chunk)
        try:
            await run_in_threadpool(_unpack, archive, uploads / upload_id, max_upload_bytes)
        except (tarfile.TarError, ValueError, OSError) as exc:
            shutil.rmtree(uploads / upload_id, ignore_errors=True)
            raise HTTPException(status_code=400, detail=f"the upload is not a usable .tar.gz: {exc}") from exc
        finally:
            archive.unlink(missing_ok=True)
        return {"upload_id": upload_id}


def _add_run_routes(app: FastAPI, member: Callable[..., tuple[str, User]], models: _ModelStorage) -> None:
    """Submit, list and read runs, and their logs."""
    store, backend = models.store, models.backend

    @app.post("/v1/orgs/{org}/runs", status_code=201)
    def submit(body: SubmitRequest, org_user: tuple[str, User] = Depends(member)) -> dict[str, Any]:
        org, user = org_user
        working_dir = models.storage_dir / org / "uploads" / body.upload_id
        if not body.upload_id.isalnum() or not working_dir.is_dir():
            raise _not_found()
        run_id = new_run_id(body.kind)
        try:
            submission_id = backend.submit(
                run_id, body.kind, body.args, working_dir, {"org": org, "user": user.id, "run": run_id}
            )
        finally:
            shutil.rmtree(working_dir, ignore_errors=True)  # Ray has packed and uploaded it
        run = store.add_run(run_id, org, user.id, body.kind, body.args, submission_id)
        return models.describe(run, backend.job(submission_id))

    @app.get("/v1/orgs/{org}/runs")
    def list_runs(org_user: tuple[str, User] = Depends(member)) -> list[dict[str, Any]]:
        jobs = backend.jobs()
        return [models.describe(run, jobs.get(run.submission_id)) for run in store.list_runs(org_user[0])]

    @app.get("/v1/orgs/{org}/runs/{run_id}")
    def get_run(run_id: str, org_user: tuple[str, User] = Depends(member)) -> dict[str, Any]:
        run = _run_of(store, org_user, run_id)
        return models.describe(run, backend.job(run.submission_id))

    @app.get("/v1/orgs/{org}/runs/{run_id}/logs")
    async def logs(run_id: str, follow: bool = False, org_user: tuple[str, User] = Depends(member)) -> Response:
        run = await run_in_threadpool(_run_of, store, org_user, run_id)
        if not follow:
            return Response(
                await run_in_threadpool(backend.logs, run.submission_id), media_type="text/plain; charset=utf-8"
            )

        async def chunks():
            async for chunk in backend.tail(run.submission_id):
                yield chunk.encode()

        return StreamingResponse(chunks(), media_type="text/plain; charset=utf-8")


def _add_run_control_routes(app: FastAPI, member: Callable[..., tuple[str, User]], models: _ModelStorage) -> None:
    """Stop and delete runs."""
    store, backend = models.store, models.backend

    @app.post("/v1/orgs/{org}/runs/{run_id}/stop")
    def stop(run_id: str, body: StopRequest, org_user: tuple[str, User] = Depends(member)) -> dict[str, Any]:
        run = _run_of(store, org_user, run_id)
        job = backend.job(run.submission_id)
        if job is None or ray_status_to_run_status(job.status) in TERMINAL:
            return models.describe(run, job)
        store.mark_stop(run.org_id, run.id, body.save_model)
        backend.request_stop(run.id, run.submission_id, getattr(job, "driver_node_id", None), body.save_model)
        return models.describe(store.get_run(run.org_id, run.id) or run, backend.job(run.submission_id))

    @app.delete("/v1/orgs/{org}/runs/{run_id}", status_code=204)
    def delete(run_id: str, force: bool = False, org_user: tuple[str, User] = Depends(member)) -> Response:
        run = _run_of(store, org_user, run_id)
        job = backend.job(run.submission_id)
        if job is not None and ray_status_to_run_status(job.status) not in TERMINAL:
            if not force:
                raise HTTPException(
                    status_code=409, detail=f"run {run.id} is running; stop it first or delete with force=true"
                )
            backend.request_stop(run.id, run.submission_id, getattr(job, "driver_node_id", None), False)
            job = _wait_terminal(backend, run.submission_id, timeout_s=60.0) or job
        backend.delete(run.id, run.submission_id, getattr(job, "driver_node_id", None) if job is not None else None)
        models.path(run).unlink(missing_ok=True)
        store.delete_run(run.org_id, run.id)
        return Response(status_code=204)


def _add_model_routes(app: FastAPI, member: Callable[..., tuple[str, User]], models: _ModelStorage) -> None:
    """Download a run's final model; list the organization's stored models."""

    @app.get("/v1/orgs/{org}/runs/{run_id}/model")
    def model(run_id: str, org_user: tuple[str, User] = Depends(member)) -> FileResponse:
        run = _run_of(models.store, org_user, run_id)
        stored = models.path(run)
        if not stored.is_file():
            job = models.backend.job(run.submission_id)
            status = ray_status_to_run_status(job.status) if job is not None else "unknown"
            if status not in TERMINAL:
                raise HTTPException(
                    status_code=409,
                    detail=f"run {run.id} is {status}: its model is ready once it ends (stop it with save_model=true)",
                )
            if not models.fetch(run, job):
                raise HTTPException(
                    status_code=404,
                    detail=f"run {run.id} left no final model (stopped without save_model, or not a training run)",
                )
        return FileResponse(stored, media_type="application/x-tar", filename=f"{run.id}.tar")

    @app.get("/v1/orgs/{org}/models")
    def list_models(org_user: tuple[str, User] = Depends(member)) -> list[dict[str, Any]]:
        folder = models.storage_dir / org_user[0] / "models"
        found = sorted(folder.glob("*.tar"), key=lambda p: p.stat().st_mtime, reverse=True) if folder.is_dir() else []
        return [{"run_id": p.stem, "size_bytes": p.stat().st_size, "stored_at": p.stat().st_mtime} for p in found]


def mask_secret_args(argv: list[str]) -> list[str]:
    """`argv` with the value of every `+key=value` whose key names a secret (`+policy_api_key=...`) as '****': the
    run list is shown to the whole organization."""
    masked = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        masked.append(f"{key}={MASK}" if sep and value and is_secret_key(key.lstrip("+").rsplit(".", 1)[-1]) else arg)
    return masked


def _seconds(milliseconds: int | None) -> float | None:
    return milliseconds / 1000.0 if milliseconds else None


def _wait_terminal(backend: RayBackend, submission_id: str, timeout_s: float) -> Any | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = backend.job(submission_id)
        if job is None or ray_status_to_run_status(job.status) in TERMINAL:
            return job
        time.sleep(0.5)
    return None


def _unpack(archive: Path, target: Path, max_bytes: int) -> None:
    """Extract a .tar.gz into `target` with tarfile's `data` filter (no absolute paths, no `..`, no links out,
    no device files).

    Raises:
        ValueError: the unpacked size exceeds `max_bytes`; tarfile.TarError: not a tar archive.
    """
    with tarfile.open(archive, "r:gz") as tar:
        members = tar.getmembers()
        if sum(m.size for m in members) > max_bytes:
            raise ValueError(f"unpacked size over {max_bytes / 2**20:.0f} MiB")
        target.mkdir(mode=0o700)
        tar.extractall(target, members=members, filter="data")


def _write_private_file(folder: Path, path: Path, data: bytes) -> None:
    tmp = folder / f".{path.name}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)
