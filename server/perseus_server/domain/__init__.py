"""The server's domain vocabulary, shared by every layer: job descriptions, states, service values, errors."""
