"""Sources: what an input is (the registry of readers, the one opener), and ties
declared for an input that records none, checked by content.
"""
