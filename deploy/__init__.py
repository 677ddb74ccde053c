"""Deployment tooling: the production Dagster stack on one machine (``python -m
deploy.prod_stack``). Standard library only; it starts Dagster's processes, never imports
Dagster."""
