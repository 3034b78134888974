"""The pure decision core: the interval model, the policy interface, the facts a
policy decides on, the estimators, the agreement rules. No I/O, no clock, no
TensorFlow: the daemon, the hook's embedded policy and the simulator run it unchanged.
"""
