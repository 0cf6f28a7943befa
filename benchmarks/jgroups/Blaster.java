/*
 * Blaster: the protocol-agnostic load generator of benchmarks/bench_vs_jgroups.py
 * (scripts/bench-vs-jgroups), which compares gossiprouter with the Java JGroups 2.12 GossipRouter.
 *
 * Blaster knows nothing about GossipRouter protocols. The Python driver pre-encodes every byte
 * sequence (JGroups 2.12 GossipData objects, or native gossiprouter frames) and hands them over
 * in a config file. Blaster opens the TCP connections (127.0.0.1 only), writes each one's
 * registration bytes, checks the router's reply, and then:
 *   - senders write a pre-encoded message frame, either as fast as the router takes it (a batch
 *     of copies, about 64 KiB, per write call) or one frame at a time at a fixed rate with
 *     System.nanoTime() (CLOCK_MONOTONIC on Linux) stamped into the payload;
 *   - receivers count what arrives. Every frame a run delivers has the same known length, so
 *     counting is arithmetic; per frame Blaster only checks a few fixed leading bytes (to catch
 *     a desynchronised stream), reads the sender-id byte (a frame carrying the receiver's own id
 *     is an echo of its own multicast, counted apart) and, when paced, the timestamp.
 *   - idle connections register and then just sit there.
 *
 * Usage: java -cp benchmarks/jgroups/classes Blaster CONFIG
 *
 * CONFIG, one directive per line; HEX is lower-case hex without separators:
 *   port P                  router port on 127.0.0.1
 *   deadline S              exit (status 3) after S seconds whatever happens: runs are bounded
 *   connect_threads N       parallel connect+register workers
 *   idle reg=HEX skip=N ok=HEX
 *                           a connection that registers and then does nothing
 *   member KEY=VALUE ...    a connection that registers, receives and maybe sends:
 *       reg=HEX skip=N ok=HEX  registration bytes; the reply is N length-prefixed (u32) frames
 *                              that are skipped, then exactly the bytes OK
 *       rlen=N check=HEX       length of every received frame; the bytes each one starts with
 *       idoff=N self=B         offset of the sender-id byte in a received frame (-1: none) and
 *                              this member's id (0..255); frames carrying it count as echoes
 *       tsoff=N                offset of the 8-byte send timestamp in a received frame (-1: none)
 *       send=HEX               the frame this member sends (absent: it only receives)
 *       rate=R                 messages per second (0: flood)
 *       stsoff=N               offset of the timestamp in the sent frame (-1: none)
 *
 * Commands on stdin, one per line:
 *   GO     start the senders
 *   MARK   print "MARK recv=.. echo=.. sent=.. bad=.. closed=.. lat=US:COUNT,..." where the
 *          counters are cumulative frame counts over all members and lat is the histogram (in
 *          microseconds) of the latencies recorded since the previous MARK
 *   STOP   exit; so does end of file on stdin, so Blaster never outlives its driver
 * Output on stdout: "MEMBERS n" once the members are registered (one after another), "READY
 * members=.. idle=.. ms=.." once the idle connections are too (in parallel), MARK lines, and
 * "ERROR ..." before a non-zero exit.
 */

import java.io.BufferedReader;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;

public final class Blaster {
    /** Latencies are kept per microsecond up to one second; longer ones share the last bucket. */
    static final int HIST_BUCKETS = 1_000_001;
    static final int BATCH_BYTES = 65536;
    static final int REGISTER_TIMEOUT_MS = 30_000;

    static volatile boolean stop = false;
    static long deadlineNanos;

    /** One registration: the bytes to write and the reply to expect. */
    static final class Registration {
        final byte[] reg;
        final int skip;
        final byte[] ok;

        Registration(Map<String, String> kv) {
            reg = hex(kv.get("reg"));
            skip = Integer.parseInt(kv.getOrDefault("skip", "0"));
            ok = hex(kv.getOrDefault("ok", ""));
        }
    }

    /** A connection that receives (and maybe sends) traffic. */
    static final class Member {
        final Registration registration;
        final int rlen;
        final byte[] check;
        final int idoff;
        final byte self;
        final int tsoff;
        final byte[] send;
        final int rate;
        final int stsoff;
        Socket sock;
        // Written by one thread each, read by the main thread at MARK.
        volatile long recv, echo, bad, sent;
        volatile boolean closed;

        Member(Map<String, String> kv) {
            registration = new Registration(kv);
            rlen = Integer.parseInt(kv.get("rlen"));
            check = hex(kv.getOrDefault("check", ""));
            idoff = Integer.parseInt(kv.getOrDefault("idoff", "-1"));
            self = (byte) Integer.parseInt(kv.getOrDefault("self", "255"));
            tsoff = Integer.parseInt(kv.getOrDefault("tsoff", "-1"));
            send = kv.containsKey("send") ? hex(kv.get("send")) : null;
            rate = Integer.parseInt(kv.getOrDefault("rate", "0"));
            stsoff = Integer.parseInt(kv.getOrDefault("stsoff", "-1"));
            if (rlen <= 0 || check.length > rlen || idoff >= rlen || tsoff + 8 > rlen) {
                throw new IllegalArgumentException("bad receive layout");
            }
            if (send != null && stsoff + 8 > send.length) {
                throw new IllegalArgumentException("bad send layout");
            }
        }
    }

    /** Latency histogram in microseconds, shared by the receivers of one process. */
    static final class Histogram {
        private final int[] counts = new int[HIST_BUCKETS];

        synchronized void record(long nanos) {
            long us = Math.max(0, nanos / 1000);
            counts[(int) Math.min(us, HIST_BUCKETS - 1)]++;
        }

        /** "US:COUNT,..." for every non-empty bucket, and clear. */
        synchronized String drain() {
            StringBuilder sb = new StringBuilder();
            for (int i = 0; i < counts.length; i++) {
                if (counts[i] != 0) {
                    if (sb.length() > 0) sb.append(',');
                    sb.append(i).append(':').append(counts[i]);
                    counts[i] = 0;
                }
            }
            return sb.toString();
        }
    }

    static final Histogram HIST = new Histogram();

    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.out.println("ERROR usage: Blaster CONFIG");
            System.exit(2);
        }
        int port = 0;
        int threads = 4;
        double deadline = 120;
        List<Registration> idle = new ArrayList<>();
        List<Member> members = new ArrayList<>();
        for (String line : Files.readAllLines(Paths.get(args[0]), StandardCharsets.US_ASCII)) {
            String[] words = line.trim().split("\\s+");
            Map<String, String> kv = new HashMap<>();
            for (int i = 1; i < words.length; i++) {
                int eq = words[i].indexOf('=');
                if (eq > 0) kv.put(words[i].substring(0, eq), words[i].substring(eq + 1));
            }
            switch (words[0]) {
                case "port": port = Integer.parseInt(words[1]); break;
                case "deadline": deadline = Double.parseDouble(words[1]); break;
                case "connect_threads": threads = Integer.parseInt(words[1]); break;
                case "idle": idle.add(new Registration(kv)); break;
                case "member": members.add(new Member(kv)); break;
                case "": break;
                default: throw new IllegalArgumentException("unknown directive " + words[0]);
            }
        }
        deadlineNanos = System.nanoTime() + (long) (deadline * 1e9);
        startWatchdog(deadline);

        long t0 = System.nanoTime();
        List<Socket> idleSockets;
        try {
            // Members one at a time first: the Java 2.12 router creates a group's table with a
            // get-then-put, so concurrent first CONNECTs to a new group can lose registrations.
            for (Member m : members) m.sock = register(port, m.registration);
            System.out.println("MEMBERS " + members.size());
            System.out.flush();
            idleSockets = registerAll(port, idle, threads);
        } catch (Exception e) {
            System.out.println("ERROR registration failed: " + e);
            System.out.flush();
            System.exit(2);
            return;
        }
        for (Member m : members) {
            Thread t = new Thread(() -> receive(m), "recv");
            t.setDaemon(true);
            t.start();
        }
        System.out.println("READY members=" + members.size() + " idle=" + idleSockets.size()
                + " ms=" + (System.nanoTime() - t0) / 1_000_000);
        System.out.flush();

        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.US_ASCII));
        String cmd;
        while ((cmd = in.readLine()) != null) {
            cmd = cmd.trim();
            if (cmd.equals("GO")) {
                for (Member m : members) {
                    if (m.send == null) continue;
                    Thread t = new Thread(() -> send(m), "send");
                    t.setDaemon(true);
                    t.start();
                }
            } else if (cmd.equals("MARK")) {
                long recv = 0, echo = 0, sent = 0, bad = 0, closed = 0;
                for (Member m : members) {
                    recv += m.recv;
                    echo += m.echo;
                    sent += m.sent;
                    bad += m.bad;
                    closed += m.closed ? 1 : 0;
                }
                System.out.println("MARK recv=" + recv + " echo=" + echo + " sent=" + sent + " bad=" + bad
                        + " closed=" + closed + " lat=" + HIST.drain());
                System.out.flush();
            } else if (cmd.equals("STOP")) {
                break;
            }
        }
        stop = true;
        System.exit(0);
    }

    /** Exit, whatever is going on, once the deadline has passed. */
    static void startWatchdog(double seconds) {
        Thread t = new Thread(() -> {
            while (true) {
                long left = deadlineNanos - System.nanoTime();
                if (left <= 0) break;
                LockSupport.parkNanos(left);
            }
            System.out.println("ERROR deadline of " + seconds + " s reached");
            System.out.flush();
            Runtime.getRuntime().halt(3);
        }, "watchdog");
        t.setDaemon(true);
        t.start();
    }

    /** Connect and register every registration, in parallel; sockets in the same order. */
    static List<Socket> registerAll(int port, List<Registration> regs, int threads) throws Exception {
        List<Socket> out = new ArrayList<>();
        if (regs.isEmpty()) return out;
        ExecutorService pool = Executors.newFixedThreadPool(Math.max(1, Math.min(threads, regs.size())));
        try {
            // Chunks, so that each worker connects its share one after another (few connects in flight).
            int n = Math.max(1, Math.min(threads, regs.size()));
            List<Callable<List<Socket>>> tasks = new ArrayList<>();
            int per = (regs.size() + n - 1) / n;
            for (int start = 0; start < regs.size(); start += per) {
                List<Registration> chunk = regs.subList(start, Math.min(regs.size(), start + per));
                tasks.add(() -> {
                    List<Socket> socks = new ArrayList<>(chunk.size());
                    for (Registration r : chunk) {
                        if (System.nanoTime() > deadlineNanos) throw new IOException("deadline");
                        socks.add(register(port, r));
                    }
                    return socks;
                });
            }
            for (Future<List<Socket>> f : pool.invokeAll(tasks)) out.addAll(f.get());
        } finally {
            pool.shutdownNow();
            pool.awaitTermination(5, TimeUnit.SECONDS);
        }
        return out;
    }

    static Socket register(int port, Registration r) throws IOException {
        Socket s = new Socket();
        s.setTcpNoDelay(true);
        s.connect(new InetSocketAddress("127.0.0.1", port), REGISTER_TIMEOUT_MS);
        s.setSoTimeout(REGISTER_TIMEOUT_MS);
        s.getOutputStream().write(r.reg);
        DataInputStream in = new DataInputStream(s.getInputStream());
        for (int i = 0; i < r.skip; i++) {
            int len = in.readInt();
            if (len < 0 || len > (1 << 20)) throw new IOException("bad reply frame length " + len);
            in.readFully(new byte[len]);
        }
        byte[] got = new byte[r.ok.length];
        in.readFully(got);
        if (!Arrays.equals(got, r.ok)) {
            throw new IOException("unexpected reply " + toHex(got) + ", wanted " + toHex(r.ok));
        }
        s.setSoTimeout(0);
        return s;
    }

    /** Count the frames arriving on one member's connection until it closes. */
    static void receive(Member m) {
        final int rlen = m.rlen;
        final byte[] check = m.check;
        final int idoff = m.idoff;
        final byte self = m.self;
        final int tsoff = m.tsoff;
        byte[] buf = new byte[Math.max(1 << 18, 4 * rlen)];
        int have = 0;
        long recv = 0, echo = 0, bad = 0;
        boolean desync = false;
        try {
            InputStream in = m.sock.getInputStream();
            while (!stop) {
                int n = in.read(buf, have, buf.length - have);
                if (n < 0) break;
                if (desync) continue;  // keep draining so that the router is never blocked by us
                have += n;
                long now = tsoff >= 0 ? System.nanoTime() : 0;
                int off = 0;
                while (have - off >= rlen) {
                    if (!startsWith(buf, off, check)) {
                        bad++;
                        desync = true;
                        break;
                    }
                    if (idoff >= 0 && buf[off + idoff] == self) echo++;
                    else recv++;
                    if (tsoff >= 0) HIST.record(now - readLong(buf, off + tsoff));
                    off += rlen;
                }
                m.recv = recv;
                m.echo = echo;
                m.bad = bad;
                if (desync) {
                    have = 0;
                } else if (off > 0) {
                    System.arraycopy(buf, off, buf, 0, have - off);
                    have -= off;
                }
            }
        } catch (IOException e) {
            // the connection is gone: report it through "closed"
        }
        m.closed = true;
    }

    /** Send one member's frame: flood in ~64 KiB writes, or paced one frame at a time. */
    static void send(Member m) {
        try {
            OutputStream out = m.sock.getOutputStream();
            if (m.rate <= 0) {
                int k = Math.max(1, BATCH_BYTES / m.send.length);
                byte[] batch = new byte[k * m.send.length];
                for (int i = 0; i < k; i++) System.arraycopy(m.send, 0, batch, i * m.send.length, m.send.length);
                long sent = 0;
                while (!stop && System.nanoTime() < deadlineNanos) {
                    out.write(batch);
                    sent += k;
                    m.sent = sent;
                }
            } else {
                byte[] frame = m.send.clone();
                long period = 1_000_000_000L / m.rate;
                long next = System.nanoTime();
                long sent = 0;
                while (!stop) {
                    long now = System.nanoTime();
                    if (now >= deadlineNanos) break;
                    if (now < next) {
                        LockSupport.parkNanos(next - now);
                        continue;
                    }
                    if (m.stsoff >= 0) writeLong(frame, m.stsoff, System.nanoTime());
                    out.write(frame);
                    m.sent = ++sent;
                    next += period;
                    // After a stall of more than 100 ms, do not burst to catch up: resume the pace.
                    if (now - next > 100_000_000L) next = now;
                }
            }
        } catch (IOException e) {
            // the connection is gone; the receiver reports it
        }
    }

    static boolean startsWith(byte[] buf, int off, byte[] prefix) {
        for (int i = 0; i < prefix.length; i++) {
            if (buf[off + i] != prefix[i]) return false;
        }
        return true;
    }

    static long readLong(byte[] b, int off) {
        long v = 0;
        for (int i = 0; i < 8; i++) v = (v << 8) | (b[off + i] & 0xff);
        return v;
    }

    static void writeLong(byte[] b, int off, long v) {
        for (int i = 7; i >= 0; i--) {
            b[off + i] = (byte) v;
            v >>>= 8;
        }
    }

    static byte[] hex(String s) {
        if (s == null || s.length() % 2 != 0) throw new IllegalArgumentException("bad hex");
        byte[] b = new byte[s.length() / 2];
        for (int i = 0; i < b.length; i++) b[i] = (byte) Integer.parseInt(s.substring(2 * i, 2 * i + 2), 16);
        return b;
    }

    static String toHex(byte[] b) {
        StringBuilder sb = new StringBuilder();
        for (byte x : b) sb.append(String.format("%02x", x));
        return sb.toString();
    }
}
