"""What the model servers are built from: the vLLM engine and its venv, the embedded model's files, Hermes tool-call
text, teacher scoring."""
