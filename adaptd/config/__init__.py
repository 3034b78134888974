"""The daemon's configuration: every setting once (schema), the kinds of value,
and the file read into a validated ``Config``.
"""
