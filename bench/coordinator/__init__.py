"""Coordinator latency and protocol cost benchmarks."""
