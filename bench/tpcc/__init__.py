"""TPC-C subset on the side-by-side harness."""
