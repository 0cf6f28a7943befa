import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.BufferedOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.logging.Level;
import java.util.logging.Logger;

import org.jgroups.Address;
import org.jgroups.Event;
import org.jgroups.JChannel;
import org.jgroups.Message;
import org.jgroups.ReceiverAdapter;
import org.jgroups.View;
import org.jgroups.conf.XmlConfigurator;

/**
 * One JGroups 2.12 JChannel member, driven over stdin/stdout by a test (tests/interop/harness.py).
 *
 * Usage: java -Djava.net.preferIPv4Stack=true -cp jgroups.jar:classes InteropNode
 *            NAME CLUSTER STACK ROUTER_HOST ROUTER_PORT
 * STACK is "tunnel" (TUNNEL + PING) or "tcpgossip" (TCP + TCPGOSSIP); everything binds to
 * 127.0.0.1. "InteropNode --print-config STACK HOST PORT" prints the stack's XML and exits.
 *
 * Output (stdout, one event per line; everything JGroups itself prints goes to stderr):
 *   CONNECTED name uuid physical      after JChannel.connect() returned
 *   VIEW n coord m2 m3 ...            on every view change (view order, coordinator first);
 *                                     also the reply to VIEW?
 *   RECV from text                    per received message (payload = UTF-8 text)
 *   SUSPECT name                      when the channel's receiver is told of a suspicion
 *   SENT MCAST|UCAST count prefix     when a send command finished
 *   PONG token / ERR text / BYE       replies
 * Commands (stdin): MCAST count prefix | UCAST name count prefix | VIEW? | PING token | QUIT.
 * The texts sent are prefix-0 .. prefix-(count-1). End of stdin counts as QUIT.
 */
public final class InteropNode extends ReceiverAdapter {

    // Strong reference: java.util.logging only holds loggers weakly, and a collected logger loses
    // its level.
    private static final Logger JGROUPS_LOGGER = Logger.getLogger("org.jgroups");

    private final PrintStream out;
    private final JChannel channel;

    private InteropNode(PrintStream out, JChannel channel) {
        this.out = out;
        this.channel = channel;
    }

    // Transport thread pools: JGroups 2.12 queues at most 500 messages per pool and discards the
    // rest (NAKACK/UNICAST then retransmit, sometimes seconds later). The tests send thousands of
    // messages at once, so give the queues room; nothing else about the pools changes.
    static final String POOLS =
        " thread_pool.queue_max_size=\"20000\" oob_thread_pool.queue_max_size=\"20000\"";

    // Everything above discovery is the same for both stacks except failure detection.
    static final String UPPER_STACK =
        "<MERGE2 min_interval=\"2000\" max_interval=\"5000\"/>"
        + "%s"
        + "<VERIFY_SUSPECT timeout=\"1500\"/>"
        + "<pbcast.NAKACK use_mcast_xmit=\"false\" retransmit_timeout=\"300,600,1200,2400\""
        + " discard_delivered_msgs=\"true\"/>"
        + "<UNICAST timeout=\"300,600,1200,2400\"/>"
        + "<pbcast.STABLE stability_delay=\"1000\" desired_avg_gossip=\"5000\" max_bytes=\"1m\"/>"
        + "<pbcast.GMS print_local_addr=\"false\" join_timeout=\"3000\" view_bundling=\"true\"/>"
        + "<UFC max_credits=\"2m\" min_threshold=\"0.4\"/>"
        + "<MFC max_credits=\"2m\" min_threshold=\"0.4\"/>"
        + "<FRAG2 frag_size=\"60000\"/>";

    /** TUNNEL (all traffic through the router) + PING (discovery by multicast via the router). */
    /** "host[p1],host[p2]" for a comma-separated list of router ports. */
    static String hostList(String routerHost, String routerPorts) {
        StringBuilder b = new StringBuilder();
        for (String p : routerPorts.split(",")) {
            if (b.length() > 0) b.append(',');
            b.append(routerHost).append('[').append(Integer.parseInt(p.trim())).append(']');
        }
        return b.toString();
    }

    static String tunnelStack(String routerHost, String routerPorts) {
        return tunnelStack(routerHost, routerPorts, "<FD_ALL interval=\"1000\" timeout=\"6000\"/>");
    }

    static String tunnelStack(String routerHost, String routerPorts, String failureDetection) {
        return "<config>"
            + "<TUNNEL gossip_router_hosts=\"" + hostList(routerHost, routerPorts) + "\""
            + " bind_addr=\"127.0.0.1\" reconnect_interval=\"1000\" enable_bundling=\"false\""
            + " enable_diagnostics=\"false\"" + POOLS + "/>"
            + "<PING timeout=\"2000\" num_initial_members=\"3\"/>"
            + String.format(UPPER_STACK, failureDetection)
            + "</config>";
    }

    /** TCP between the members; TCPGOSSIP asks the router who is there (GOSSIP_GET). */
    static String tcpGossipStack(String routerHost, String routerPorts) {
        return "<config>"
            + "<TCP bind_addr=\"127.0.0.1\" bind_port=\"0\" loopback=\"true\""
            + " sock_conn_timeout=\"1000\" enable_diagnostics=\"false\"" + POOLS + "/>"
            + "<TCPGOSSIP initial_hosts=\"" + hostList(routerHost, routerPorts) + "\""
            + " timeout=\"3000\" num_initial_members=\"3\" reconnect_interval=\"1000\"/>"
            + String.format(UPPER_STACK, "<FD timeout=\"2000\" max_tries=\"3\"/>")
            + "</config>";
    }

    static String stackConfig(String stack, String routerHost, String routerPort) {
        if (stack.equals("tunnel")) {
            return tunnelStack(routerHost, routerPort);
        }
        if (stack.equals("tunnel-fd30")) {
            // FD_ALL suspecting after 30 s (JGroups' own heartbeats cross the broker): a broker
            // outage shorter than that must cause no view change from the routers' side.
            return tunnelStack(routerHost, routerPort, "<FD_ALL interval=\"2000\" timeout=\"30000\"/>");
        }
        if (stack.equals("tcpgossip")) {
            return tcpGossipStack(routerHost, routerPort);
        }
        throw new IllegalArgumentException("unknown stack: " + stack);
    }

    private static String nameOf(Address addr) {
        if (addr == null) {
            return "null";
        }
        if (addr instanceof org.jgroups.util.UUID) {
            String name = org.jgroups.util.UUID.get(addr);
            if (name != null) {
                return name;
            }
        }
        return addr.toString();
    }

    private synchronized void emit(String line) {
        out.print(line);
        out.print('\n');
        out.flush();
    }

    private String viewLine(View view) {
        if (view == null) {
            return "VIEW 0";
        }
        StringBuilder sb = new StringBuilder("VIEW ").append(view.size());
        for (Address member : view.getMembers()) {
            sb.append(' ').append(nameOf(member));
        }
        return sb.toString();
    }

    @Override
    public void viewAccepted(View view) {
        emit(viewLine(view));
    }

    @Override
    public void receive(Message msg) {
        byte[] buf = msg.getBuffer();
        String text = buf == null ? "" : new String(buf, StandardCharsets.UTF_8);
        emit("RECV " + nameOf(msg.getSrc()) + " " + text);
    }

    @Override
    public void suspect(Address addr) {
        emit("SUSPECT " + nameOf(addr));
    }

    private Address memberByName(String name) {
        View view = channel.getView();
        if (view == null) {
            return null;
        }
        for (Address member : view.getMembers()) {
            if (name.equals(nameOf(member))) {
                return member;
            }
        }
        return null;
    }

    private void send(Address dest, int count, String prefix) throws Exception {
        for (int i = 0; i < count; i++) {
            byte[] payload = (prefix + "-" + i).getBytes(StandardCharsets.UTF_8);
            channel.send(new Message(dest, null, payload));
        }
    }

    /** Runs one command; returns false when the node should stop. */
    private boolean handle(String line) {
        String[] parts = line.trim().split("\\s+");
        if (parts.length == 0 || parts[0].isEmpty()) {
            return true;
        }
        try {
            switch (parts[0]) {
                case "MCAST": {
                    int count = Integer.parseInt(parts[1]);
                    send(null, count, parts[2]);
                    emit("SENT MCAST " + count + " " + parts[2]);
                    return true;
                }
                case "UCAST": {
                    Address dest = memberByName(parts[1]);
                    if (dest == null) {
                        emit("ERR UCAST no member named " + parts[1] + " in "
                            + viewLine(channel.getView()));
                        return true;
                    }
                    int count = Integer.parseInt(parts[2]);
                    send(dest, count, parts[3]);
                    emit("SENT UCAST " + count + " " + parts[3]);
                    return true;
                }
                case "VIEW?":
                    emit(viewLine(channel.getView()));
                    return true;
                case "PING":
                    emit("PONG " + (parts.length > 1 ? parts[1] : ""));
                    return true;
                case "QUIT":
                    return false;
                default:
                    emit("ERR unknown command: " + line);
                    return true;
            }
        } catch (Exception e) {
            emit("ERR " + parts[0] + " failed: " + e.toString().replace('\n', ' '));
            return true;
        }
    }

    public static void main(String[] args) throws Exception {
        // Keep the protocol stream clean: only this class writes to the real stdout.
        PrintStream out = new PrintStream(
            new BufferedOutputStream(new FileOutputStream(FileDescriptor.out), 1 << 16),
            false, "UTF-8");
        System.setOut(System.err);

        if (args.length == 4 && args[0].equals("--print-config")) {
            out.println(stackConfig(args[1], args[2], args[3]));
            out.flush();
            return;
        }
        if (args.length != 5) {
            System.err.println("usage: InteropNode NAME CLUSTER tunnel|tcpgossip HOST PORT[,PORT...]\n"
                + "       InteropNode --print-config tunnel|tcpgossip HOST PORT");
            System.exit(2);
        }
        String name = args[0];
        String cluster = args[1];
        String xml = stackConfig(args[2], args[3], args[4]);

        JGROUPS_LOGGER.setLevel(Level.parse(System.getProperty("interop.loglevel", "WARNING")));

        JChannel channel = new JChannel(XmlConfigurator.getInstance(
            new ByteArrayInputStream(xml.getBytes(StandardCharsets.UTF_8)), Boolean.FALSE));
        channel.setName(name);
        InteropNode node = new InteropNode(out, channel);
        channel.setReceiver(node);
        channel.connect(cluster);
        Address self = channel.getAddress();
        Object physical = channel.downcall(new Event(Event.GET_PHYSICAL_ADDRESS, self));
        String uuid = self instanceof org.jgroups.util.UUID
            ? ((org.jgroups.util.UUID) self).toStringLong() : String.valueOf(self);
        node.emit("CONNECTED " + name + " " + uuid + " " + physical);

        BufferedReader in =
            new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (!node.handle(line)) {
                break;
            }
        }
        channel.close();
        node.emit("BYE");
        out.flush();
        // JGroups 2.12 leaves non-daemon timer threads behind; end the JVM explicitly.
        System.exit(0);
    }
}
