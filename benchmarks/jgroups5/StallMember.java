/*
 * StallMember: one real JGroups 5.x member (JChannel on the stock conf/tunnel.xml stack: TUNNEL,
 * PING, MERGE3, FD_ALL3, VERIFY_SUSPECT, NAKACK2, UNICAST3, STABLE, GMS, UFC, MFC, FRAG2,
 * STATE_TRANSFER) for benchmarks/bench_stalled_member.py: the stalled-member measurement of
 * issue 31. It needs a JGroups 5.x jar or classes directory; the JGroups 2.12 jar will not do.
 *
 * Usage: java -Djava.net.preferIPv4Stack=true -Djgroups.bind_addr=127.0.0.1
 *            -Djgroups.tunnel.gossip_router_hosts=127.0.0.1[PORT] -cp JGROUPS:classes
 *            StallMember INDEX MEMBERS CLUSTER DEADLINE_S
 * INDEX is this member's number (0..MEMBERS-1), written into every message it sends. The JVM
 * exits after DEADLINE_S seconds whatever happens, so a member never outlives its run.
 *
 * Every message is SIZE bytes: u32 sender index, u32 sequence number, zeros. The member records
 * System.nanoTime() (CLOCK_MONOTONIC on Linux, the driver's time.monotonic_ns()) when it starts
 * sending each of its messages and when it is delivered each message of the others.
 *
 * Commands (stdin), one reply line each (stdout):
 *   GO RATE SIZE          start sending RATE msg/s of SIZE bytes       -> GO
 *   HALTAT NS             send nothing once nanoTime() >= NS           -> HALTAT
 *   SENTBY NS             how many sends started before NS             -> SENTBY n
 *   GOTBY S A B NS        of S's messages A..B-1, how many were delivered here by NS -> GOTBY n
 *   LASTOF S N            when S's messages 0..N-1 had all been delivered: the latest delivery
 *                         time, or -1 and how many are missing       -> LASTOF ns missing
 *   QUIT                  exit (so does end of stdin)
 * Before the first command is read: "CONNECTED INDEX" once JChannel.connect() returned, then
 * "READY INDEX" once the view has MEMBERS members.
 */

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.atomic.AtomicLongArray;
import java.util.concurrent.locks.LockSupport;

import org.jgroups.BytesMessage;
import org.jgroups.JChannel;
import org.jgroups.Message;
import org.jgroups.Receiver;
import org.jgroups.View;

public final class StallMember implements Receiver {
    /** Messages kept per sender: 200 msg/s for 5 minutes fits. */
    static final int MAX_SEQ = 1 << 16;

    final int self;
    final int members;
    final AtomicLongArray[] delivered;
    final AtomicLongArray sentAt = new AtomicLongArray(MAX_SEQ);
    volatile int sent = 0;
    volatile long haltAt = Long.MAX_VALUE;
    volatile int viewSize = 0;
    JChannel channel;

    StallMember(int self, int members) {
        this.self = self;
        this.members = members;
        delivered = new AtomicLongArray[members];
        for (int i = 0; i < members; i++) delivered[i] = new AtomicLongArray(MAX_SEQ);
    }

    @Override
    public void receive(Message msg) {
        long now = System.nanoTime();
        ByteBuffer b = ByteBuffer.wrap(msg.getArray(), msg.getOffset(), msg.getLength());
        int sender = b.getInt();
        int seq = b.getInt();
        if (sender == self || sender < 0 || sender >= members || seq < 0 || seq >= MAX_SEQ) return;
        delivered[sender].compareAndSet(seq, 0L, now);
    }

    @Override
    public void viewAccepted(View view) {
        viewSize = view.size();
        System.err.println("view " + view);
    }

    void sendLoop(int rate, int size) {
        long interval = 1_000_000_000L / rate;
        long next = System.nanoTime();
        while (sent < MAX_SEQ) {
            long now = System.nanoTime();
            if (now >= haltAt) return;
            if (next - now > 0) {
                LockSupport.parkNanos(next - now);
                continue;
            }
            // After a stall (SIGSTOP) of more than 100 ms, resume the pace rather than burst.
            if (now - next > 100_000_000L) next = now;
            next += interval;
            byte[] buf = new byte[size];  // JGroups keeps it for retransmission: never reused
            ByteBuffer.wrap(buf).putInt(self).putInt(sent);
            int seq = sent;
            sentAt.set(seq, now);
            sent = seq + 1;
            try {
                channel.send(new BytesMessage(null, buf));
            } catch (Exception e) {
                System.err.println("send failed: " + e);
            }
        }
    }

    String command(String line) {
        String[] w = line.trim().split("\\s+");
        switch (w[0]) {
            case "GO": {
                int rate = Integer.parseInt(w[1]);
                int size = Math.max(8, Integer.parseInt(w[2]));
                Thread t = new Thread(() -> sendLoop(rate, size), "sender");
                t.setDaemon(true);
                t.start();
                return "GO";
            }
            case "HALTAT":
                haltAt = Long.parseLong(w[1]);
                return "HALTAT";
            case "SENTBY": {
                long ns = Long.parseLong(w[1]);
                int n = 0;
                int upto = sent;
                while (n < upto && sentAt.get(n) < ns) n++;
                return "SENTBY " + n;
            }
            case "GOTBY": {
                int s = Integer.parseInt(w[1]), a = Integer.parseInt(w[2]), z = Integer.parseInt(w[3]);
                long ns = Long.parseLong(w[4]);
                int n = 0;
                for (int i = a; i < z; i++) {
                    long t = delivered[s].get(i);
                    if (t != 0 && t <= ns) n++;
                }
                return "GOTBY " + n;
            }
            case "LASTOF": {
                int s = Integer.parseInt(w[1]), z = Integer.parseInt(w[2]);
                long last = 0;
                int missing = 0;
                for (int i = 0; i < z; i++) {
                    long t = delivered[s].get(i);
                    if (t == 0) missing++;
                    else last = Math.max(last, t);
                }
                return "LASTOF " + (missing > 0 ? -1 : last) + " " + missing;
            }
            default:
                return "ERR unknown command " + w[0];
        }
    }

    public static void main(String[] args) throws Exception {
        int self = Integer.parseInt(args[0]);
        int members = Integer.parseInt(args[1]);
        String cluster = args[2];
        long deadlineMs = (long) (Double.parseDouble(args[3]) * 1000);
        Thread killer = new Thread(() -> {
            try { Thread.sleep(deadlineMs); } catch (InterruptedException e) { return; }
            System.err.println("deadline reached");
            Runtime.getRuntime().halt(3);
        }, "deadline");
        killer.setDaemon(true);
        killer.start();

        StallMember m = new StallMember(self, members);
        m.channel = new JChannel("tunnel.xml");
        m.channel.setName("m" + self);
        m.channel.setReceiver(m);
        m.channel.connect(cluster);
        System.out.println("CONNECTED " + self);
        System.out.flush();
        while (m.viewSize < members) Thread.sleep(20);
        System.out.println("READY " + self);
        System.out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) continue;
            if (line.trim().equals("QUIT")) break;
            System.out.println(m.command(line));
            System.out.flush();
        }
        m.channel.close();
        Runtime.getRuntime().halt(0);
    }
}
