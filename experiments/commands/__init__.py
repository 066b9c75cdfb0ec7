"""One module per command of ``python -m experiments``; see ``experiments.cli``."""
