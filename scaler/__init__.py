"""The scaler's shared runtime: the CLI, the embedded NATS server, and what every component needs."""
