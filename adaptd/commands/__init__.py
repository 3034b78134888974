"""One module per ``adaptd`` subcommand.

Each module defines ``HELP`` (one line), ``configure(parser)`` to add its
arguments, and ``run(args) -> int`` returning the exit code. Modules are imported
only when their command runs, so ``adaptd status`` never pays for scipy or
TensorFlow.
"""
