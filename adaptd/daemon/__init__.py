"""The daemon's runtime (``adaptd serve``): the loop, its sockets, its parts and
the events between them.
"""
