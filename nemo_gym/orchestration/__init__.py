"""Orchestration (`ng_run`, `ng_status`): starting a config's servers, each in its own process and virtual environment,
locally, on Ray or by URL."""
