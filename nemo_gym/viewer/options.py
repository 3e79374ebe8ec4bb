"""Parameters of `ng_viewer` (kept apart from `app` so that `+help=true` does not import Gradio)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ViewerOptions"]


class ViewerOptions(BaseModel):
    """Parameters of `ng_viewer`."""

    model_config = ConfigDict(extra="forbid")
    jsonl_fpath: str = Field(
        description="rollouts JSONL to browse (ng_collect_rollouts output, or any rows with response + reward)"
    )
    baseline_jsonl_fpath: str | None = Field(
        None,
        description=(
            "a second rollouts JSONL of the same tasks (e.g. before training): adds a Compare tab, this file left,"
            " jsonl_fpath right"
        ),
    )
    pass_threshold: float = Field(1.0, description="in the Compare tab, a rollout passes when reward >= pass_threshold")
    server_host: str = Field("127.0.0.1", description="address to bind (0.0.0.0 exposes the viewer to the network)")
    server_port: int = Field(7860, description="port to bind; when taken, the next free port is used (and printed)")
