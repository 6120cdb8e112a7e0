"""The deployment's router: requests in flight, their routes and token streams, fallbacks."""
