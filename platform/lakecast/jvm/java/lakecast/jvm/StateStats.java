package lakecast.jvm;

import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import org.apache.spark.SparkEnv;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;

/**
 * What a task's JVM holds of a lookup's state, measured where it lives: {@code
 * call(manifest)} returns, on a task's first row of each call (a manifest literal; null on
 * the others, so an aggregate of it costs a check per row), {@code (executor, jvm, cold, build_ms,
 * state_bytes, state_rows, evictions, lineages)}: the executor and JVM holding the state
 * version the manifest names, whether this JVM built it from the base for this version
 * ({@code cold}) and the milliseconds its files took — reported by the first task to
 * report the version in that JVM, the later ones say warm and 0 — its estimated heap
 * bytes and rows, the lineages the JVM's LRU evicted so far and the lineages it holds.
 */
public final class StateStats implements UDF1<byte[], Row> {
    private static final long serialVersionUID = 1L;
    private static final String JVM = ManagementFactory.getRuntimeMXBean().getName();
    /** The manifests (by the literal's array) this task reported: each call of the UDF
     * in a plan is its own literal, and they may share this instance. */
    private transient java.util.Set<byte[]> reported;
    /** The driver's file system settings (see {@link StateLookup}). */
    private final java.util.HashMap<String, String> storage = StateStorage.driverSettings();

    @Override
    public Row call(byte[] manifest) throws Exception {
        if (reported == null) {
            reported = java.util.Collections.newSetFromMap(new java.util.IdentityHashMap<>());
        }
        if (!reported.add(manifest)) {
            return null;
        }
        StateStorage.offer(storage);
        State state = StateLookup.resolved(new String(manifest, StandardCharsets.UTF_8));
        boolean first = state.claim();
        SparkEnv env = SparkEnv.get();
        return RowFactory.create(env == null ? "driver" : env.executorId(), JVM,
            first && state.cold, first ? state.buildNanos / 1e6 : 0.0, state.bytes,
            state.rows, StateLookup.evictions(), StateLookup.lineages());
    }
}
