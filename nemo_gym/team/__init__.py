"""Team use: `ng_serve` (a run server in front of a Ray cluster's job submission) and its client.

store        the server's state: organizations, users, hashed bearer tokens, runs (SQLite, mode 0600)
server       the FastAPI app: the API, the uploads, the runs' stored models
command      `ng_serve` (local Ray head or `+ray_address=`, Ray token auth on) and its `+admin=` actions
backend      the Ray side: Ray Jobs submission, logs, stop with save_model, the model fetched from the run's node
job          the entrypoint of a submitted run (`python -m nemo_gym.team.job train|collect ...`)
client       `ng_login +server=`, `ng_orgs`, and the HTTP client of the run server (`TeamClient`)
remote_runs  `ng_runs ... +remote=true`, `ng_train +remote=true`, `ng_status`'s section, `list_server_models`
"""

__all__: list[str] = []
