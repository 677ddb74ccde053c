"""Lakecast's Dagster batch assets: raw data, dimensions, user segments."""
