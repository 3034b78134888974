"""The hook's restore path: which step a run continues from, the newest intact
checkpoint, verification, and a restore from a durable destination.
"""
