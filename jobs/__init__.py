"""Lakecast's micro-batch jobs, sensors, schedules and the Definitions object."""
