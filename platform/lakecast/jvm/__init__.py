"""Lakecast's JVM side: the lookup into task-local broadcast state held in the executor JVM.

* ``java/lakecast/jvm/StateLookup.java``: a Spark Java UDF; each executor JVM keeps one
  state per table and pipeline, brought forward by the chain's Arrow IPC files;
* :mod:`lakecast.jvm.build`: compiles it with ``javac`` against pyspark's JARs into the
  JAR cache (``lakecast setup``; no download), and names the JAR the Spark session and the
  Lakecast Spark server load.

The Python side (state files, planning) is :mod:`lakecast.runtime.jvm_state`.
"""
