"""The effect executors: they act on the platform for the events that concern them and report back."""
