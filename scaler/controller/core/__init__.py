"""The controller's pure core: state folded from events, and decisions taken on it.

No I/O and no clock reads here: time arrives as an argument. Replay, the offline simulator and
the live controller all run this same code. A test fails if this package imports anything
that does I/O.
"""
