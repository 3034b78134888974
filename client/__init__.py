"""The training-loop hook (import name ``adaptd.client``)."""
