"""Prime Intellect's formats: prime-rl TOML configs and verifiers environments (`ng_train +prime_toml=...`)."""
