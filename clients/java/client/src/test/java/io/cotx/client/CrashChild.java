package io.cotx.client;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.Statement;

/** The process CrashTest kills: one global transaction over both engines, stopped at a step
 * (a TransactionListener parks the thread there and says so on stdout) and killed -9 by the
 * test. Arguments: daemon url, token, PostgreSQL port, MariaDB port, key, step
 * ({@code prepared}: every branch prepared, the decision not asked for; {@code decided}: the
 * decision known, no branch finished). */
public final class CrashChild {
    public static void main(String[] a) throws Exception {
        String url = a[0];
        String token = a[1];
        String key = a[4];
        String step = a[5];
        Coordinator coord = Coordinator.builder(url).token(token).build();
        coord.addListener(new TransactionListener() {
            @Override
            public void prepared(Transaction tx) {
                if (step.equals("prepared")) {
                    park(tx, "prepared");
                }
            }

            @Override
            public void decided(Transaction tx, String decision) {
                if (step.equals("decided")) {
                    park(tx, decision);
                }
            }
        });
        try (Connection pg = DriverManager.getConnection("jdbc:postgresql://127.0.0.1:" + a[2] + "/postgres?user=postgres");
                Connection my = DriverManager.getConnection("jdbc:mariadb://127.0.0.1:" + a[3] + "/test?user=root")) {
            Transaction tx = coord.transaction();
            tx.branch(pg, "savings");
            try (Statement s = pg.createStatement()) {
                s.execute("INSERT INTO crash VALUES ('" + key + "', 1)");
            }
            tx.branch(my, "checking");
            try (Statement s = my.createStatement()) {
                s.execute("INSERT INTO crash VALUES ('" + key + "', 1)");
            }
            tx.commit();
            System.out.println("DONE " + tx.gtid() + " " + tx.outcome());
        }
    }

    static void park(Transaction tx, String what) {
        System.out.println("READY " + tx.gtid() + " " + what);
        System.out.flush();
        try {
            Thread.sleep(600_000); // parked until the test kills this process
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
