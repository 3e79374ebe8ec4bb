"""What every layer of nemo_gym uses: the exception tree (`errors`), where things are and the layers of the package
(`layout`), path containment (`paths`), JSONL files (`jsonl`) and process helpers (`processes`). Nothing here imports
another folder of nemo_gym."""
