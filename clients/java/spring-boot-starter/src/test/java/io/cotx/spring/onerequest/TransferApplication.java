package io.cotx.spring.onerequest;

import io.cotx.spring.GlobalTransactional;
import io.cotx.spring.GlobalTransactions;
import java.util.Map;
import javax.sql.DataSource;
import org.springframework.beans.factory.annotation.Qualifier;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.stereotype.Service;

/** One service with both resources (savings on PostgreSQL, checking on MariaDB) and a
 * {@code @GlobalTransactional} method writing to both: with {@code cotx.one-request=true} its
 * commit is its only request to the daemon (OneRequestStarterTest); one that propagates its
 * gtid takes the begin. */
@SpringBootApplication
public class TransferApplication {
    @Service
    public static class Transfers {
        private final JdbcTemplate savings;
        private final JdbcTemplate checking;

        public Transfers(@Qualifier("savingsDataSource") DataSource savings, @Qualifier("checkingDataSource") DataSource checking) {
            this.savings = new JdbcTemplate(savings);
            this.checking = new JdbcTemplate(checking);
        }

        /** A row {@code key} in both accounts, as one global transaction. */
        @GlobalTransactional
        public void open(String key) {
            savings.update("INSERT INTO savings VALUES (?, 1, '')", key);
            checking.update("INSERT INTO checking VALUES (?, 1, '')", key);
        }

        /** As {@link #open}, the decision in the savings branch's COMMIT (pg_co's co.decide). */
        @GlobalTransactional(decideInParticipant = true)
        public void openDecidingInSavings(String key) {
            savings.update("INSERT INTO savings VALUES (?, 1, '')", key);
            checking.update("INSERT INTO checking VALUES (?, 1, '')", key);
        }

        /** As {@link #open}, asking for the headers to call another service with in between
         * (what the starter's RestClient interceptor does): such a transaction needs the begin. */
        @GlobalTransactional
        public Map<String, String> openAndPropagate(String key) {
            savings.update("INSERT INTO savings VALUES (?, 1, '')", key);
            Map<String, String> headers = GlobalTransactions.current().headers();
            checking.update("INSERT INTO checking VALUES (?, 1, '')", key);
            return headers;
        }
    }
}
