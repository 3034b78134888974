"""The contracts between processes: the job protocol (hook <-> daemon), the
operator protocol (CLI <-> daemon) and where their sockets live.
"""
