"""Evaluation (`ng_eval`): pass@k, comparisons of two rollout files, confidence intervals, rollouts shown in the
terminal."""
