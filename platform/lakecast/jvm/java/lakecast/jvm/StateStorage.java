package lakecast.jvm;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.util.HashMap;
import java.util.Map;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.SparkContext;
import org.apache.spark.SparkContext$;
import org.apache.spark.SparkEnv;
import org.apache.spark.deploy.SparkHadoopUtil;
import scala.Option;

/**
 * Where the executors read the state chain from: any URI Hadoop's {@link FileSystem} reads
 * ({@code file:}, {@code s3a://}, {@code hdfs://}, ...), with the cluster's Hadoop
 * configuration. In a JVM that runs the SparkContext (local mode, the driver) that is the
 * context's own configuration (settings put in it after start included); on an executor,
 * the application's {@code spark.hadoop.*} settings ({@link SparkHadoopUtil}) and, over them,
 * the driver's own file system settings ({@link #driverSettings()}) that the lookup UDFs carry
 * from the driver ({@link #offer}): an executor sees neither the driver's {@code core-site.xml}
 * (where the Lakecast Spark server keeps the object store's credentials, off its Spark conf)
 * nor its environment, and a Hadoop {@link FileSystem} an executor happened to create for a
 * Delta scan (with the scan's configuration) is not there for a new executor's first lookup.
 */
final class StateStorage {
    private static volatile Configuration conf;
    /** The driver's settings {@link #conf} was built with (executors). */
    private static volatile Map<String, String> offered = new HashMap<>();

    private StateStorage() {
    }

    /**
     * The settings of the driver's Hadoop configuration (in a JVM that runs the SparkContext:
     * where a lookup UDF is created) under {@code fs.} whose value is not Hadoop's default:
     * the object store's endpoint, credentials and options, whatever file they came from.
     * Empty in a JVM without a SparkContext. A UDF holds them from its creation, and so they
     * travel to the executors in its tasks, as the driver's Hadoop configuration does for a
     * Spark file scan.
     */
    static HashMap<String, String> driverSettings() {
        HashMap<String, String> out = new HashMap<>();
        Option<SparkContext> active = SparkContext$.MODULE$.getActive();
        if (!active.isDefined()) {
            return out;
        }
        Configuration defaults = new Configuration(false);
        defaults.addResource("core-default.xml");
        for (Map.Entry<String, String> e : active.get().hadoopConfiguration()) {
            String key = e.getKey();
            if (key.startsWith("fs.") && !String.valueOf(e.getValue())
                    .equals(defaults.getRaw(key))) {
                out.put(key, e.getValue());
            }
        }
        return out;
    }

    /**
     * The driver's settings a UDF carries ({@link #driverSettings()}), given before each
     * state read: in an executor, the configuration is (re)built with them over its own.
     */
    static void offer(Map<String, String> driver) {
        if (driver == null || driver.isEmpty() || driver.equals(offered)) {
            return;
        }
        synchronized (StateStorage.class) {
            if (!driver.equals(offered) && !SparkContext$.MODULE$.getActive().isDefined()) {
                Configuration c = base();
                for (Map.Entry<String, String> e : driver.entrySet()) {
                    c.set(e.getKey(), e.getValue());
                }
                offered = new HashMap<>(driver);
                conf = c;
            }
        }
    }

    private static Configuration base() {
        SparkEnv env = SparkEnv.get();
        return env != null ? SparkHadoopUtil.get().newConfiguration(env.conf())
            : new Configuration();
    }

    static Configuration conf() {
        Configuration c = conf;
        if (c != null) {
            return c;
        }
        synchronized (StateStorage.class) {
            if (conf == null) {
                Option<SparkContext> active = SparkContext$.MODULE$.getActive();
                conf = active.isDefined() ? active.get().hadoopConfiguration() : base();
            }
            return conf;
        }
    }

    /** The bytes of {@code uri}; a missing file is {@link FileNotFoundException}. */
    static byte[] read(String uri) throws IOException {
        Path path = new Path(uri);
        FileSystem fs = path.getFileSystem(conf());
        FileStatus status = fs.getFileStatus(path);  // FileNotFoundException when absent
        long length = status.getLen();
        if (length > Integer.MAX_VALUE - 16) {
            throw new IOException("state file " + uri + " is larger than 2 GB");
        }
        byte[] bytes = new byte[(int) length];
        try (FSDataInputStream in = fs.open(path)) {
            in.readFully(0, bytes);
        }
        return bytes;
    }

    /** Whether {@code uri} exists (a folder of an object store: any key under it). */
    static boolean exists(String uri) {
        try {
            Path path = new Path(uri);
            return path.getFileSystem(conf()).exists(path);
        } catch (IOException | RuntimeException e) {
            return true;  // unknown: keep the state (only its memory is at stake)
        }
    }
}
