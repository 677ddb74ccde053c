package lakecast.jvm;

import java.math.BigDecimal;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.spark.sql.Row;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * One state version as tasks read it: a read-only index built once per version, so a task
 * reading version v never sees a row of v+1 whatever the key type (the lineage's map moves
 * on; this index does not). Integer keys (Spark hands them as {@code Long}) go through an
 * array by key when dense (as Spark's own hashed relation does), else open addressing over
 * a {@code long[]}; other keys through open addressing over their {@code equals}.
 *
 * <p>It also carries what the batch's accounting reads ({@link StateStats}): its rows, its
 * size in this JVM (estimated from the objects it holds), and how this JVM came to hold it
 * (built from the base, i.e. cold, and the time its files took), claimed by the first
 * report only.
 */
final class State {
    private final LongIndex longs;
    private final ObjectIndex objects;
    final long rows;
    final long bytes;
    final boolean cold;
    final long buildNanos;
    private final AtomicBoolean claimed = new AtomicBoolean();

    private State(LongIndex longs, ObjectIndex objects, long rows, long bytes, boolean cold,
                  long buildNanos) {
        this.longs = longs;
        this.objects = objects;
        this.rows = rows;
        this.bytes = bytes;
        this.cold = cold;
        this.buildNanos = buildNanos;
    }

    static State of(Map<Object, Row> rows, Interner interner, boolean cold, long buildNanos) {
        boolean allLong = true;
        for (Object key : rows.keySet()) {
            if (!(key instanceof Long)) {
                allLong = false;
                break;
            }
        }
        long bytes = interner.sharedBytes();
        for (Map.Entry<Object, Row> e : rows.entrySet()) {
            bytes += (allLong ? 0 : Sizes.of(e.getKey())) + Sizes.row(e.getValue(), interner);
        }
        if (allLong) {
            LongIndex index = new LongIndex(rows);
            return new State(index, null, rows.size(), bytes + index.bytes(), cold, buildNanos);
        }
        ObjectIndex index = new ObjectIndex(rows);
        return new State(null, index, rows.size(), bytes + index.bytes(), cold, buildNanos);
    }

    Row get(Object key) {
        if (longs != null) {
            return key instanceof Long ? longs.get((Long) key) : null;
        }
        return objects.get(key);
    }

    /** Whether this is the first report of this version in this JVM (which then counts
     *  its build). */
    boolean claim() {
        return claimed.compareAndSet(false, true);
    }

    /** Estimated heap bytes of the objects a state holds. */
    static final class Sizes {
        private Sizes() {
        }

        static long of(Object v) {
            if (v == null || v instanceof Boolean) {
                return 0;
            }
            if (v instanceof UTF8String) {
                return 24 + pad(16 + ((UTF8String) v).numBytes());
            }
            if (v instanceof String) {
                return 24 + pad(16 + ((String) v).length());
            }
            if (v instanceof byte[]) {
                return pad(16 + ((byte[]) v).length);
            }
            if (v instanceof BigDecimal) {
                return 64;
            }
            if (v instanceof List) {
                long n = 16 + pad(16 + 8L * ((List<?>) v).size());
                for (Object o : (List<?>) v) {
                    n += of(o);
                }
                return n;
            }
            return 24;  // a boxed number, a LocalDate, an Instant
        }

        /** A row: its object and array, and the values no other row shares. */
        static long row(Row row, Interner interner) {
            long n = 16 + pad(16 + 8L * row.length());
            for (int j = 0; j < row.length(); j++) {
                if (!interner.interned(j)) {
                    n += of(row.get(j));
                }
            }
            return n;
        }

        static long pad(long n) {
            return (n + 7) & ~7L;
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

        /** Whether column {@code j}'s values are shared (counted once, not per row). */
        boolean interned(int column) {
            return column < open.size() && open.get(column);
        }

        /** The bytes of the shared values (and their table). */
        long sharedBytes() {
            long n = 0;
            for (int j = 0; j < columns.size(); j++) {
                if (open.get(j)) {
                    for (Object v : columns.get(j).keySet()) {
                        n += Sizes.of(v) + 48;
                    }
                }
            }
            return n;
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

        static int mix(long k) {
            long h = k * 0x9E3779B97F4A7C15L;
            return (int) (h ^ (h >>> 32));
        }

        long bytes() {
            return dense != null ? Sizes.pad(16 + 8L * dense.length)
                : Sizes.pad(16 + 8L * keys.length) * 2;
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

    /** A read-only {@code Object -> Row} index of one state version (strings, booleans,
     *  decimals, composite keys as lists). */
    static final class ObjectIndex {
        private final Object[] keys;
        private final Row[] slots;
        private final int mask;

        ObjectIndex(Map<Object, Row> rows) {
            int capacity = Integer.highestOneBit(Math.max(8, rows.size()) * 2 - 1) << 1;
            keys = new Object[capacity];
            slots = new Row[capacity];
            mask = capacity - 1;
            for (Map.Entry<Object, Row> e : rows.entrySet()) {
                int i = LongIndex.mix(e.getKey().hashCode()) & mask;
                while (slots[i] != null) {
                    i = (i + 1) & mask;
                }
                keys[i] = e.getKey();
                slots[i] = e.getValue();
            }
        }

        long bytes() {
            return Sizes.pad(16 + 8L * keys.length) * 2;
        }

        Row get(Object k) {
            int i = LongIndex.mix(k.hashCode()) & mask;
            while (true) {
                Row row = slots[i];
                if (row == null || keys[i].equals(k)) {
                    return row;
                }
                i = (i + 1) & mask;
            }
        }
    }
}
