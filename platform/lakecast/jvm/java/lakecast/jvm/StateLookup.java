package lakecast.jvm;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.lang.ref.WeakReference;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.time.LocalDate;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.DateDayVector;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.TimeStampMicroTZVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowFileReader;
import org.apache.arrow.vector.ipc.message.ArrowBlock;
import org.apache.arrow.vector.util.ByteArrayReadableSeekableByteChannel;
import org.apache.arrow.vector.util.Text;
import org.apache.spark.SparkEnv;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF2;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Lakecast's keyed lookup into task-local broadcast state held in the executor JVM.
 *
 * <p>{@code call(manifest, key)}: the state row of {@code key} (a value, or a Row of the
 * key columns), or null when the state has no row for it. {@code manifest} is the UTF-8
 * URI of a manifest, a binary literal: Spark hands the UDF the literal's one array every
 * row, so a task resolves its state once per lookup (each lookup's literal is its own
 * array: two lookups of one UDF keep a state each, no reload when calls alternate). The
 * manifest (written by {@code lakecast.runtime.jvm_state}) names the state's lineage on its
 * first line and, on the next ones, the URIs of the Arrow IPC files of its chain in order:
 * a {@code .full.arrow} replaces the state, a {@code .changes.arrow} applies a version's
 * changes (deletes, then inserts and update post-images). Files are read through Hadoop's
 * FileSystem ({@link StateStorage}): the chain lives on storage every executor reads (the
 * checkpoint root by default), and this JVM's memory is a cache of it.
 *
 * <p>Each executor JVM keeps one state per lineage (the newest chain it was asked for) and
 * applies only the files after the ones it holds, so a warm executor reads a new version's
 * changes, not the table; a state of another chain is built apart. A lineage whose folder
 * the driver removed (its runtime closed) is dropped (checked at most every
 * {@link #SWEEP_MILLIS} ms); at most {@code spark.lakecast.jvm.maxLineages} (default
 * {@link #DEFAULT_MAX_LINEAGES}) are kept, least recently used out first, each eviction
 * counted ({@link #evictions()}).
 */
public final class StateLookup implements UDF2<byte[], Object, Row> {
    private static final long serialVersionUID = 1L;
    /** Lineages kept per JVM unless {@code spark.lakecast.jvm.maxLineages} says otherwise. */
    static final int DEFAULT_MAX_LINEAGES = 16;
    static final String MAX_LINEAGES_CONF = "spark.lakecast.jvm.maxLineages";
    static final long SWEEP_MILLIS = 30_000L;
    private static final AtomicLong EVICTIONS = new AtomicLong();
    private static long lastSweep;
    private static final Map<String, Lineage> LINEAGES =
        new LinkedHashMap<String, Lineage>(16, 0.75f, true) {
            @Override
            protected boolean removeEldestEntry(Map.Entry<String, Lineage> eldest) {
                if (size() > maxLineages()) {
                    EVICTIONS.incrementAndGet();
                    return true;
                }
                return false;
            }
        };
    private static int maxLineages = -1;
    /** The state each manifest's lookups last resolved (weakly: the LRU decides). */
    private static final Map<String, WeakReference<State>> RESOLVED = new ConcurrentHashMap<>();

    /** The driver's file system settings, from where this UDF was created (the driver): an
     *  executor reads the state root with them ({@link StateStorage#offer}). */
    private final HashMap<String, String> storage = StateStorage.driverSettings();

    /** The manifests this task's calls named (by the literal's array) and their states. */
    private transient byte[][] manifests;
    private transient State[] states;

    @Override
    public Row call(byte[] manifest, Object key) throws Exception {
        State state = resolve(manifest);
        if (key instanceof Row) {
            key = compositeKey((Row) key);
        }
        return key == null ? null : state.get(key);
    }

    /** The state of {@code manifest}, resolved once per task and lookup. */
    State resolve(byte[] manifest) throws IOException {
        if (manifests == null) {
            manifests = new byte[4][];
            states = new State[4];
        }
        for (int i = 0; i < manifests.length; i++) {
            if (manifests[i] == manifest) {
                return states[i];
            }
        }
        for (int i = 0; i < manifests.length; i++) {  // another array of the same bytes
            if (manifests[i] != null && Arrays.equals(manifests[i], manifest)) {
                manifests[i] = manifest;
                return states[i];
            }
        }
        String uri = new String(manifest, StandardCharsets.UTF_8);
        StateStorage.offer(storage);
        State state = stateAt(uri);
        if (RESOLVED.size() > 256) {
            RESOLVED.clear();
        }
        RESOLVED.put(uri, new WeakReference<>(state));
        System.arraycopy(manifests, 0, manifests, 1, manifests.length - 1);
        System.arraycopy(states, 0, states, 1, states.length - 1);
        manifests[0] = manifest;
        states[0] = state;
        return state;
    }

    static int maxLineages() {
        if (maxLineages < 0) {
            SparkEnv env = SparkEnv.get();
            maxLineages = Math.max(1, env == null ? DEFAULT_MAX_LINEAGES
                : env.conf().getInt(MAX_LINEAGES_CONF, DEFAULT_MAX_LINEAGES));
        }
        return maxLineages;
    }

    /** Lineages evicted by the LRU in this JVM since it started. */
    static long evictions() {
        return EVICTIONS.get();
    }

    /** Lineages this JVM holds. */
    static int lineages() {
        synchronized (LINEAGES) {
            return LINEAGES.size();
        }
    }

    /** The state a lookup of this JVM last resolved for {@code manifest} (what a task's
     * {@link StateStats} reports: not rebuilt if the LRU evicted it since), else the state
     * the manifest names. */
    static State resolved(String manifest) throws IOException {
        WeakReference<State> ref = RESOLVED.get(manifest);
        State state = ref == null ? null : ref.get();
        return state != null ? state : stateAt(manifest);
    }

    /** The state the manifest names, built or brought forward in this JVM. */
    static State stateAt(String manifest) throws IOException {
        byte[] text;
        try {
            text = StateStorage.read(manifest);
        } catch (FileNotFoundException e) {
            throw missing("manifest", manifest);
        } catch (IOException | RuntimeException e) {
            throw unreadable("manifest", manifest, e);
        }
        List<String> lines = new ArrayList<>();
        for (String line : new String(text, StandardCharsets.UTF_8).split("\n")) {
            if (!line.isEmpty()) {
                lines.add(line);
            }
        }
        if (lines.isEmpty()) {
            throw new IOException("empty Lakecast state manifest " + manifest);
        }
        Lineage lineage;
        synchronized (LINEAGES) {
            long now = System.currentTimeMillis();
            if (now - lastSweep > SWEEP_MILLIS) {
                // a lineage whose folder is gone was closed by its runtime: free its state
                lastSweep = now;
                LINEAGES.keySet().removeIf(k -> !StateStorage.exists(folderOf(k)));
            }
            lineage = LINEAGES.computeIfAbsent(lines.get(0), k -> new Lineage());
        }
        return lineage.at(lines.subList(1, lines.size()));
    }

    /** The start of every state error's message (the driver translates them). */
    static final String STATE_ERROR = "Lakecast JVM lookup state ";

    /** The error of a state file or manifest gone while a job needed it. */
    static IOException missing(String what, String path) {
        return new IOException(STATE_ERROR + what + " " + path
            + " is missing: the runtime that wrote it was closed or rebased while this job"
            + " ran, its folder was removed, or this executor cannot see the state root"
            + " (LAKECAST_JVM_STATE_ROOT). Rerun the batch (its runtime writes the state files"
            + " again); put the state root on storage every executor reads, or pass"
            + " jvm_lookups=False to keep the state in the Python workers.");
    }

    /** The error of a state file or manifest that exists but cannot be read. */
    static IOException unreadable(String what, String path, Exception cause) {
        String why = String.valueOf(cause.getMessage()).split("\\R", 2)[0];
        IOException e = new IOException(STATE_ERROR + what + " " + path
            + " is unreadable (" + cause.getClass().getSimpleName() + ": " + why + "): it was"
            + " damaged, its permissions changed after the driver wrote it, or this executor"
            + " lacks the credentials of the state root. Remove the state folder and rerun the"
            + " batch (its runtime writes the state files again), or pass jvm_lookups=False to"
            + " keep the state in the Python workers.");
        e.initCause(cause);
        return e;
    }

    /** The state folder of a lineage ({@code <folder>|<table>}). */
    static String folderOf(String lineage) {
        int bar = lineage.lastIndexOf('|');
        return bar < 0 ? lineage : lineage.substring(0, bar);
    }

    /** A composite key as a list of its values; null when any is null (no match). */
    static Object compositeKey(Row row) {
        Object[] values = new Object[row.length()];
        for (int i = 0; i < values.length; i++) {
            if (row.isNullAt(i)) {
                return null;
            }
            values[i] = row.get(i);
        }
        return Arrays.asList(values);
    }

    /** One table's state in this JVM and the chain files applied to it. */
    static final class Lineage {
        private List<String> applied = new ArrayList<>();
        private Map<Object, Row> rows = new ConcurrentHashMap<>();
        private State.Interner interner = new State.Interner();
        /** What tasks read: {@code rows} as of {@code applied} (null: not built yet). */
        private State state;

        synchronized State at(List<String> files) throws IOException {
            boolean extends_ = files.size() >= applied.size()
                && files.subList(0, applied.size()).equals(applied);
            if (!extends_) {  // another chain (an older version, a new base): built apart
                rows = new ConcurrentHashMap<>();
                applied = new ArrayList<>();
                interner = new State.Interner();
                state = null;
            }
            boolean cold = applied.isEmpty();
            long start = System.nanoTime();
            for (String file : files.subList(applied.size(), files.size())) {
                rows = apply(rows, file, interner);
                applied.add(file);
                state = null;
            }
            if (state == null) {
                state = State.of(rows, interner, cold, System.nanoTime() - start);
            }
            return state;
        }
    }

    private static byte[] readFile(String file) throws IOException {
        try {
            return StateStorage.read(file);
        } catch (FileNotFoundException e) {
            throw missing("file", file);
        } catch (IOException | RuntimeException e) {
            throw unreadable("file", file, e);
        }
    }

    /** {@code rows} with a state file applied: a full file gives a new map, a changes file
     *  changes {@code rows} (tasks read {@link State} indexes, never this map). */
    static Map<Object, Row> apply(Map<Object, Row> rows, String file, State.Interner interner)
            throws IOException {
        boolean full = file.endsWith(".full.arrow");
        if (!full && !file.endsWith(".changes.arrow")) {
            throw new IOException("not a Lakecast state file: " + file);
        }
        byte[] bytes = readFile(file);
        try (BufferAllocator alloc = new RootAllocator();
             ArrowFileReader reader = new ArrowFileReader(
                 new ByteArrayReadableSeekableByteChannel(bytes), alloc)) {
            VectorSchemaRoot root = reader.getVectorSchemaRoot();
            String keys = root.getSchema().getCustomMetadata().get("lakecast.keys");
            if (keys == null) {
                throw new IOException("state file without lakecast.keys metadata: " + file);
            }
            int nKeys = Integer.parseInt(keys);
            if (full) {  // sized for the table's rows: no rehashing while it loads
                String total = root.getSchema().getCustomMetadata().get("lakecast.rows");
                long expected = total == null ? 16 : Long.parseLong(total);
                rows = new ConcurrentHashMap<>((int) Math.min(1 << 29, expected * 4 / 3 + 16));
            }
            // a version's deletes first, then its upserts, over the whole file: its record
            // batches may hold both kinds in any order (an overwrite's inserts come first)
            List<ArrowBlock> blocks = reader.getRecordBlocks();
            if (!full) {
                for (ArrowBlock block : blocks) {
                    reader.loadRecordBatch(block);
                    applyDeletes(rows, root, nKeys);
                }
            }
            for (ArrowBlock block : blocks) {
                reader.loadRecordBatch(block);
                applyUpserts(rows, root, nKeys, full, interner);
            }
        } catch (IOException | RuntimeException e) {
            if (String.valueOf(e.getMessage()).startsWith(STATE_ERROR)) {
                throw e;
            }
            throw unreadable("file", file, e);
        }
        return rows;
    }

    private static void applyDeletes(Map<Object, Row> rows, VectorSchemaRoot root,
                                     int nKeys) {
        List<FieldVector> vectors = root.getFieldVectors();
        FieldVector change = vectors.get(vectors.size() - 1);
        for (int i = 0; i < root.getRowCount(); i++) {
            if ("delete".equals(key(change, i))) {
                Object key = keyAt(vectors, nKeys, i);
                if (key != null) {
                    rows.remove(key);
                }
            }
        }
    }

    private static void applyUpserts(Map<Object, Row> rows, VectorSchemaRoot root, int nKeys,
                                     boolean full, State.Interner interner) {
        List<FieldVector> vectors = root.getFieldVectors();
        int nValues = vectors.size() - nKeys - (full ? 0 : 1);
        FieldVector change = full ? null : vectors.get(vectors.size() - 1);
        for (int i = 0; i < root.getRowCount(); i++) {
            if (change != null) {
                Object type = key(change, i);
                if (!"insert".equals(type) && !"update_postimage".equals(type)) {
                    continue;
                }
            }
            Object key = keyAt(vectors, nKeys, i);
            if (key == null) {
                continue;  // a null key never matches (the version gate refuses them)
            }
            Object[] values = new Object[nValues];
            for (int j = 0; j < nValues; j++) {
                values[j] = interner.intern(j, value(vectors.get(nKeys + j), i));
            }
            rows.put(key, RowFactory.create(values));
        }
    }

    private static Object keyAt(List<FieldVector> vectors, int nKeys, int i) {
        if (nKeys == 1) {
            return key(vectors.get(0), i);
        }
        Object[] values = new Object[nKeys];
        for (int j = 0; j < nKeys; j++) {
            values[j] = key(vectors.get(j), i);
            if (values[j] == null) {
                return null;
            }
        }
        return Arrays.asList(values);
    }

    /** A key as Spark hands it to the UDF (strings as String). */
    static Object key(FieldVector vector, int i) {
        if (vector.isNull(i)) {
            return null;
        }
        Object value = vector.getObject(i);
        return value instanceof Text ? value.toString() : value;
    }

    /** A state value as Spark takes it back: strings as UTF8String (Spark keeps them as
     *  they are, no encoding per row), dates as LocalDate, instants as Instant. */
    static Object value(FieldVector vector, int i) {
        if (vector.isNull(i)) {
            return null;
        }
        if (vector instanceof DateDayVector) {
            return LocalDate.ofEpochDay(((DateDayVector) vector).get(i));
        }
        if (vector instanceof TimeStampMicroTZVector) {
            long micros = ((TimeStampMicroTZVector) vector).get(i);
            return Instant.ofEpochSecond(Math.floorDiv(micros, 1_000_000L),
                Math.floorMod(micros, 1_000_000L) * 1_000L);
        }
        Object value = vector.getObject(i);
        return value instanceof Text ? UTF8String.fromBytes(((Text) value).copyBytes()) : value;
    }
}
