"""Entry point: ``python -m experiments <command> ...``."""

from experiments.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
