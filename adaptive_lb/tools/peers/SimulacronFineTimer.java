// The 1 ms-timer launcher of adaptive_lb.tools.peers.simulacron (compiled there with javac against
// simulacron-standalone-0.12.0.jar). Same wiring as com.datastax.oss.simulacron.standalone.App.main
// (read with javap from the 0.12.0 jar), plus Server.builder().withTimer(<1 ms HashedWheelTimer>).
import ch.qos.logback.classic.Level;
import ch.qos.logback.classic.Logger;
import com.datastax.oss.simulacron.http.server.ActivityLogManager;
import com.datastax.oss.simulacron.http.server.ClusterManager;
import com.datastax.oss.simulacron.http.server.EndpointManager;
import com.datastax.oss.simulacron.http.server.HttpContainer;
import com.datastax.oss.simulacron.http.server.QueryManager;
import com.datastax.oss.simulacron.server.Inet4Resolver;
import com.datastax.oss.simulacron.server.Server;
import io.netty.util.HashedWheelTimer;
import java.net.InetAddress;
import java.util.concurrent.TimeUnit;
import org.slf4j.LoggerFactory;

/** Simulacron's standalone App with a fine HashedWheelTimer (the stock one ticks every 100 ms). */
public final class SimulacronFineTimer {
  public static void main(String[] args) throws Exception {
    System.setProperty("vertx.disableDnsResolver", "true");
    String httpIntf = "localhost";
    int httpPort = 8187;
    String ip = "127.0.0.1";
    String level = "ERROR";
    boolean activityLog = true;
    long tickMicros = 1000;
    for (int i = 0; i < args.length; i++) {
      switch (args[i]) {
        case "--httpintf": httpIntf = args[++i]; break;
        case "--httpport": httpPort = Integer.parseInt(args[++i]); break;
        case "--ip": ip = args[++i]; break;
        case "--loglevel": level = args[++i]; break;
        case "--tick-micros": tickMicros = Long.parseLong(args[++i]); break;
        case "--disable-activity-log": activityLog = false; break;
        default: throw new IllegalArgumentException("unknown option " + args[i]);
      }
    }
    Level lvl = Level.toLevel(level, Level.ERROR);
    ((Logger) LoggerFactory.getLogger("ROOT")).setLevel(lvl);
    ((Logger) LoggerFactory.getLogger("com.datastax")).setLevel(lvl);
    HttpContainer http = new HttpContainer(httpIntf, httpPort, false);
    byte[] start = InetAddress.getByName(ip).getAddress();
    HashedWheelTimer timer = new HashedWheelTimer(tickMicros, TimeUnit.MICROSECONDS, 512);
    Server server =
        Server.builder()
            .withActivityLoggingEnabled(activityLog)
            .withAddressResolver(new Inet4Resolver(start))
            .withTimer(timer)
            .build();
    new ClusterManager(server).registerWithRouter(http.getRouter());
    new QueryManager(server).registerWithRouter(http.getRouter());
    new EndpointManager(server).registerWithRouter(http.getRouter());
    new ActivityLogManager(server).registerWithRouter(http.getRouter());
    http.start().get(10, TimeUnit.SECONDS);
    System.err.println("SIMULACRON-FINE-TIMER READY tick_us=" + tickMicros);
    synchronized (SimulacronFineTimer.class) {
      SimulacronFineTimer.class.wait();
    }
  }
}
