"""A training run on disk: its directory's layout, the checkpoint format, loading a run."""
