"""Training state both ways: a torch optimizer's state as optax's, and a run as a
CheckpointManager step.
"""
