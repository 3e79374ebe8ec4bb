"""Code that runs inside the vLLM engine venv, where nemo_gym is not installed: the GGUF conversion script and the
weight-sync worker extension. Each file here imports only the standard library, torch and the engine's packages."""
