package lakecast.jvm;

import java.io.FileInputStream;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Paths;
import java.time.Instant;
import java.time.LocalDate;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.DateDayVector;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.TimeStampMicroTZVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowFileReader;
import org.apache.arrow.vector.ipc.message.ArrowBlock;
import org.apache.arrow.vector.util.Text;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF2;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Lakecast's keyed lookup into task-local broadcast state held in the executor JVM.
 *
 * <p>{@code call(manifest, key)}: the state row of {@code key} (a value, or a Row of the
 * key columns), or null when the state has no row for it. {@code manifest} is the UTF-8
 * path of a manifest, a binary literal: Spark hands the UDF the literal's one array every
 * row, so a task resolves its state once (no string decoded per row). The manifest (written by
 * {@code lakecast.runtime.jvm_state}) names the state's lineage on its first line and, on
 * the next ones, the Arrow IPC files of its chain in order: a {@code .full.arrow} replaces
 * the state, a {@code .changes.arrow} applies a version's changes (deletes, then inserts and
 * update post-images). Each executor JVM keeps one state per lineage (the newest chain it
 * was asked for) and applies only the files after the ones it holds, so a warm executor
 * reads a new version's changes, not the table. States of other chains are built apart.
 * A lineage whose folder the driver removed (its runtime closed) is dropped; at most
 * {@link #MAX_LINEAGES} are kept, least recently used out first.
 */
public final class StateLookup implements UDF2<byte[], Object, Row> {
    private static final long serialVersionUID = 1L;
    /** Lineages kept per JVM (least recently used first out). */
    static final int MAX_LINEAGES = 16;
    private static final Map<String, Lineage> LINEAGES =
        new LinkedHashMap<String, Lineage>(16, 0.75f, true) {
            @Override
            protected boolean removeEldestEntry(Map.Entry<String, Lineage> eldest) {
                return size() > MAX_LINEAGES;
            }
        };

    private transient byte[] lastManifest;
    private transient State lastState;

    @Override
    public Row call(byte[] manifest, Object key) throws Exception {
        if (manifest != lastManifest && !Arrays.equals(manifest, lastManifest)) {
            lastState = stateAt(new String(manifest, StandardCharsets.UTF_8));
        }
        lastManifest = manifest;
        if (key instanceof Row) {
            key = compositeKey((Row) key);
        }
        return key == null ? null : lastState.get(key);
    }

    /** The state the manifest names, built or brought forward in this JVM. */
    static State stateAt(String manifest) throws IOException {
        List<String> lines;
        try {
            lines = Files.readAllLines(Paths.get(manifest));
        } catch (NoSuchFileException e) {
            throw missing("manifest", manifest);
        } catch (IOException e) {
            throw unreadable("manifest", manifest, e);
        }
        if (lines.isEmpty()) {
            throw new IOException("empty Lakecast state manifest " + manifest);
        }
        Lineage lineage;
        synchronized (LINEAGES) {
            // a lineage whose folder is gone was closed by its runtime: free its state
            LINEAGES.keySet().removeIf(k -> !Files.isDirectory(Paths.get(folderOf(k))));
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
            + " ran, or its var/jvm-state folder was removed. Rerun the batch (its runtime"
            + " writes the state files again); executors must see the project's var/ folder,"
            + " or pass jvm_lookups=False to keep the state in the Python workers.");
    }

    /** The error of a state file or manifest that exists but cannot be read. */
    static IOException unreadable(String what, String path, Exception cause) {
        String why = String.valueOf(cause.getMessage()).split("\\R", 2)[0];
        IOException e = new IOException(STATE_ERROR + what + " " + path
            + " is unreadable (" + cause.getClass().getSimpleName() + ": " + why + "): it was"
            + " damaged or its permissions changed after the driver wrote it. Remove the"
            + " project's var/jvm-state folder and rerun the batch (its runtime writes the"
            + " state files again), or pass jvm_lookups=False to keep the state in the Python"
            + " workers.");
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
        private Interner interner = new Interner();
        /** What tasks read: {@code rows} as of {@code applied} (null: not built yet). */
        private State state;

        synchronized State at(List<String> files) throws IOException {
            boolean extends_ = files.size() >= applied.size()
                && files.subList(0, applied.size()).equals(applied);
            if (!extends_) {  // another chain (an older version, a new base): built apart
                rows = new ConcurrentHashMap<>();
                applied = new ArrayList<>();
                interner = new Interner();
                state = null;
            }
            for (String file : files.subList(applied.size(), files.size())) {
                rows = apply(rows, file, interner);
                applied.add(file);
                state = null;
            }
            if (state == null) {
                state = State.of(rows);
            }
            return state;
        }
    }

    /** A state version as tasks read it. Integer keys (Spark hands them as {@code Long})
     *  go through a flat index built once per version: an array by key when the keys are
     *  dense (as Spark's own hashed relation does), else open addressing over a
     *  {@code long[]}, so a lookup touches two arrays and its row instead of a hash map's
     *  chain of boxed objects. Other keys use the map. */
    static final class State {
        private final Map<Object, Row> rows;
        private final LongIndex longs;

        private State(Map<Object, Row> rows, LongIndex longs) {
            this.rows = rows;
            this.longs = longs;
        }

        static State of(Map<Object, Row> rows) {
            for (Object key : rows.keySet()) {
                if (!(key instanceof Long)) {
                    return new State(rows, null);
                }
            }
            return new State(rows, new LongIndex(rows));
        }

        Row get(Object key) {
            if (longs != null) {
                return key instanceof Long ? longs.get((Long) key) : null;
            }
            return rows.get(key);
        }
    }

    /** Equal values of a column share one instance while the column has few distinct
     *  values (segments, categories, prices): a state's rows then point at a few hot
     *  objects instead of a copy each, which is what a lookup's result reads. */
    static final class Interner {
        /** Distinct values a column may have before it is no longer interned. */
        static final int MAX_DISTINCT = 1 << 16;
        private final List<Map<Object, Object>> columns = new ArrayList<>();
        private final List<Boolean> open = new ArrayList<>();

        Object intern(int column, Object value) {
            if (value == null || value instanceof byte[]) {
                return value;  // (arrays compare by identity)
            }
            while (columns.size() <= column) {
                columns.add(new HashMap<>());
                open.add(true);
            }
            if (!open.get(column)) {
                return value;
            }
            Map<Object, Object> seen = columns.get(column);
            Object known = seen.putIfAbsent(value, value);
            if (known != null) {
                return known;
            }
            if (seen.size() > MAX_DISTINCT) {  // a high-cardinality column: stop here
                seen.clear();
                open.set(column, false);
            }
            return value;
        }
    }

    /** A read-only {@code long -> Row} index of one state version. */
    static final class LongIndex {
        private final long min;
        private final long max;
        private final Row[] dense;
        private final long[] keys;
        private final Row[] slots;
        private final int mask;

        LongIndex(Map<Object, Row> rows) {
            long lo = 0;
            long hi = -1;
            for (Object key : rows.keySet()) {
                long k = (Long) key;
                if (hi < lo) {
                    lo = k;
                    hi = k;
                }
                lo = Math.min(lo, k);
                hi = Math.max(hi, k);
            }
            min = lo;
            max = hi;
            int n = rows.size();
            if (n > 0 && hi - lo >= 0 && hi - lo < 4L * n + 1024) {
                dense = new Row[(int) (hi - lo + 1)];
                for (Map.Entry<Object, Row> e : rows.entrySet()) {
                    dense[(int) ((Long) e.getKey() - lo)] = e.getValue();
                }
                keys = null;
                slots = null;
                mask = 0;
                return;
            }
            dense = null;
            int capacity = Integer.highestOneBit(Math.max(8, n) * 2 - 1) << 1;
            keys = new long[capacity];
            slots = new Row[capacity];
            mask = capacity - 1;
            for (Map.Entry<Object, Row> e : rows.entrySet()) {
                long k = (Long) e.getKey();
                int i = mix(k) & mask;
                while (slots[i] != null) {
                    i = (i + 1) & mask;
                }
                keys[i] = k;
                slots[i] = e.getValue();
            }
        }

        private static int mix(long k) {
            long h = k * 0x9E3779B97F4A7C15L;
            return (int) (h ^ (h >>> 32));
        }

        Row get(long k) {
            if (k < min || k > max) {
                return null;
            }
            if (dense != null) {
                return dense[(int) (k - min)];
            }
            int i = mix(k) & mask;
            while (true) {
                Row row = slots[i];
                if (row == null || keys[i] == k) {
                    return row;
                }
                i = (i + 1) & mask;
            }
        }
    }

    private static FileInputStream open(String file) throws IOException {
        try {
            return new FileInputStream(file);
        } catch (FileNotFoundException e) {
            if (Files.exists(Paths.get(file))) {
                throw unreadable("file", file, e);
            }
            throw missing("file", file);
        }
    }

    /** {@code rows} with a state file applied: a full file gives a new map (tasks still
     *  reading the old one keep it whole), a changes file changes {@code rows}. */
    static Map<Object, Row> apply(Map<Object, Row> rows, String file, Interner interner)
            throws IOException {
        boolean full = file.endsWith(".full.arrow");
        if (!full && !file.endsWith(".changes.arrow")) {
            throw new IOException("not a Lakecast state file: " + file);
        }
        try (BufferAllocator alloc = new RootAllocator();
             FileInputStream in = open(file);
             ArrowFileReader reader = new ArrowFileReader(in.getChannel(), alloc)) {
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
                                     boolean full, Interner interner) {
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
