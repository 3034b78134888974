"""Checkpoint files read without a framework: TensorFlow's (the state file, a
checkpoint's size, the per-rank parts of a multi-worker job's steps) and what Orbax
commits (:mod:`adaptd.checkpoints.orbax`).
"""
