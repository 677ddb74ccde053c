package lakecast.jvm;

import java.io.FileNotFoundException;
import java.io.IOException;
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
 * the application's {@code spark.hadoop.*} settings ({@link SparkHadoopUtil}).
 */
final class StateStorage {
    private static volatile Configuration conf;

    private StateStorage() {
    }

    static Configuration conf() {
        Configuration c = conf;
        if (c != null) {
            return c;
        }
        synchronized (StateStorage.class) {
            if (conf == null) {
                Option<SparkContext> active = SparkContext$.MODULE$.getActive();
                SparkEnv env = SparkEnv.get();
                if (active.isDefined()) {
                    conf = active.get().hadoopConfiguration();
                } else if (env != null) {
                    conf = SparkHadoopUtil.get().newConfiguration(env.conf());
                } else {
                    conf = new Configuration();
                }
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
