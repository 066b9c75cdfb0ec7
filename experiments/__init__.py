"""Command line, configs, experiment tracking and benchmarks of the AdaPtis toolkit."""
