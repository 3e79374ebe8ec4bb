"""NVIDIA NeMo Gym itself: its server folders run unmodified in release venvs, their detection, its cookie sessions and
its reward profile."""
