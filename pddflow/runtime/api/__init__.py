"""The OpenAI-compatible HTTP API of a deployment: it translates HTTP to the router protocol."""
