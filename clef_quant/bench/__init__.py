"""Benchmarks: library functions that measure and return results; the CLI renders and writes them."""
