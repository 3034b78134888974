"""TensorFlow's checkpoint files without TensorFlow: the state file, a
checkpoint's size, and the per-rank parts of a multi-worker job's steps.
"""
