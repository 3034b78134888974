"""Tiered checkpoint storage: replicate completed local checkpoints to durable destinations.

See docs/tiers.md.
"""
