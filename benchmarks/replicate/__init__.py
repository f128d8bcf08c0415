"""Small-scale replication of the AoT and KVT papers' comparisons (issue 4): `python -m benchmarks.replicate`."""
