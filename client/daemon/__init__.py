"""The hook's link to its daemon: the socket and the conversation (hello, reports,
plans), with the embedded policy while the daemon is away.
"""
