"""NATS JetStream, both ways (PROTOCOL §10): a topic into a stream, a stream into a topic."""
