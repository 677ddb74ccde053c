"""Runnable keyed broadcast examples from the seeds (Flink's worked examples on Lakecast).

* :mod:`examples.pattern_rules` — seed 001: shape-pattern rules matched per color;
* :mod:`examples.fraud_detection` — seed 004: small-then-large fraud rules with keyed
  state, an event-time timer and a TTL;
* :mod:`examples.model_serving` — seed 002: model distribution with per-task metrics.

Each module holds the keyed function, a deterministic data generator, an independent
plain-Python reference of the expected outputs and a ``main()`` that runs it on Spark.
:mod:`examples.common` drives a function step by step in the harness or on Spark.
"""
