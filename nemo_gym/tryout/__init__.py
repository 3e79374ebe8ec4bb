"""`ng_try`: a few rollouts (or SFT examples) of a project, shown readably before training."""
