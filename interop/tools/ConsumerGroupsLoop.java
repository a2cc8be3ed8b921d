// ConsumerGroupsLoop runs a Kafka command-line tool's main class once per
// line of standard input, in one JVM, for the interop harness's
// kafka-consumer-groups-diff row (interop/harness/tools.go): a JVM start
// per run cost about 2 s of the row's CI time each.
//
//   java -cp KAFKA_TOOLS_CLASSPATH interop/tools/ConsumerGroupsLoop.java MAIN_CLASS
//
// Each input line is one run's arguments, separated by tabs. The run's
// standard output and error (in the order written) are printed, then a
// line "@@kproxy-interop-end EXIT_CODE". The tool's calls to Kafka's Exit
// (org.apache.kafka.common.utils.Exit) end the run with that code instead
// of the JVM; code 0 when main returns.
import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;

import org.apache.kafka.common.utils.Exit;

public class ConsumerGroupsLoop {
    static final String END = "@@kproxy-interop-end ";

    /** Thrown by the exit and halt procedures to end one run. */
    static final class ExitCalled extends RuntimeException {
        final int code;

        ExitCalled(int code) {
            super("exit " + code, null, false, false);
            this.code = code;
        }
    }

    public static void main(String[] argv) throws Exception {
        Method main = Class.forName(argv[0]).getMethod("main", String[].class);
        PrintStream out = System.out, err = System.err;
        Exit.setExitProcedure((code, message) -> {
            throw new ExitCalled(code);
        });
        Exit.setHaltProcedure((code, message) -> {
            throw new ExitCalled(code);
        });
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        for (String line; (line = in.readLine()) != null; ) {
            String[] args = line.isEmpty() ? new String[0] : line.split("\t", -1);
            ByteArrayOutputStream buf = new ByteArrayOutputStream();
            PrintStream both = new PrintStream(buf, true, StandardCharsets.UTF_8);
            System.setOut(both);
            System.setErr(both);
            int code = 0;
            try {
                main.invoke(null, (Object) args);
            } catch (InvocationTargetException e) {
                if (e.getCause() instanceof ExitCalled) {
                    code = ((ExitCalled) e.getCause()).code;
                } else {
                    e.getCause().printStackTrace(both);
                    code = -1;
                }
            } finally {
                both.flush();
                System.setOut(out);
                System.setErr(err);
            }
            out.print(buf.toString(StandardCharsets.UTF_8));
            out.println();
            out.println(END + code);
            out.flush();
        }
    }
}
