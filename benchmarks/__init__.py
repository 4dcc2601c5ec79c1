"""numbax benchmark suite: python -m benchmarks.run --help."""
