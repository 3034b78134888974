"""adaptd: an adaptive checkpoint scheduler for deep learning training.

The package holds the daemon and the shared core (protocol, policy interface,
interval model). It never imports TensorFlow; the training-loop hook lives in
:mod:`adaptd.client`.
"""

__version__ = "0.1.0"
