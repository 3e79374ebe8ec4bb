"""Where things are: this checkout's root and the three server folders' names (no imports of nemo_gym: every module may use it)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["REPO_ROOT", "SERVER_TYPES"]

REPO_ROOT = Path(__file__).resolve().parent.parent
SERVER_TYPES = ("resources_servers", "responses_api_agents", "responses_api_models")
