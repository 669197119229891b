package io.cotx.spring.onerequest;

import io.cotx.spring.GlobalTransactional;
import javax.sql.DataSource;
import org.springframework.beans.factory.annotation.Qualifier;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.stereotype.Service;

/** One service with both resources (savings on PostgreSQL, checking on MariaDB) and a
 * {@code @GlobalTransactional} method writing to both: with {@code cotx.one-request=true} its
 * commit is its only request to the daemon (OneRequestStarterTest). */
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
    }
}
