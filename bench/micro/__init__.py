"""Microbenchmark of the side-by-side harness (micro.py) and the MariaDB isolation side check."""
