"""Sweeps shipped with jaxformer: `jaxformer-sweep --sweep NAME` (jaxformer/training/sweep.py)."""
