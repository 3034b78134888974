"""One module per ``adaptd`` subcommand.

Each module defines ``HELP`` (one line, the command's help in ``adaptd --help``;
:mod:`adaptd.cli` reads it from here, nowhere else), ``configure(parser)`` to add its
arguments, and ``run(args) -> int`` returning the exit code. A module is imported
only when its command runs (or for the list in ``adaptd --help``), so ``adaptd
status`` never pays for scipy or TensorFlow.
"""
