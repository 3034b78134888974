"""The daemon's operator side: who may ask, drains, what status shows."""
