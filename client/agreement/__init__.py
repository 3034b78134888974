"""How a job's ranks agree on save and restore steps: in-band on TensorFlow's
coordination service, or through the daemon's rounds.
"""
