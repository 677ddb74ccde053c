"""Lakecast's JVM side: the lookup into task-local broadcast state held in the executor JVM.

* ``java/lakecast/jvm/StateLookup.java``: a Spark Java UDF; each executor JVM keeps one
  state per table and pipeline, brought forward by the chain's Arrow IPC files;
* :mod:`lakecast.jvm.build`: the JAR the wheel ships (compiled at the wheel's build,
  ``build_backend/``), put into the JAR cache by ``lakecast setup`` (compiled there with
  ``javac``, :mod:`lakecast.jvm.javac`, only when no shipped JAR matches; no download),
  and names the JAR the Spark session and the Lakecast Spark server load;
* :mod:`lakecast.jvm.probe`: whether a session can load the JAR it started with.

The Python side (state files, planning) is :mod:`lakecast.runtime.jvm_state`.
"""
