"""Deploying a plan: the `Deployment` object and the backends that run its instances."""
