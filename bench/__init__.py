"""cotx benchmarks (see bench/README.md): run the scripts by path or with `python -m bench.<part>.<script>`."""
