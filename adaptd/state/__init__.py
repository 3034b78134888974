"""What outlives the daemon's process: the SQLite store, its schema, the records
it keeps, the learned figures and the state directory's lock.
"""
