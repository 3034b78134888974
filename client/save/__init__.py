"""The hook's save path: the schedule of save steps, one asynchronous save at a
time, what a checkpoint holds, what a save cost.
"""
