"""The daemon's jobs: their records and registry, their plans (planner,
operator settings), the rounds of jobs whose ranks agree through the daemon, and
operator actions on one job.
"""
