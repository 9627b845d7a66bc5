"""Benchmarks (run as scripts; see bench/README.md). A package so their tools have import paths."""
