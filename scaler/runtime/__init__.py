"""What every process of ours shares: NATS and its streams, the clock, the embedded nats-server, how a service runs."""
