"""Command-line programs: translate, evaluate, average_checkpoints (train is train.py)."""
