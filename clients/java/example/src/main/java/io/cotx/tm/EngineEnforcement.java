package io.cotx.tm;

import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import javax.sql.XAConnection;
import javax.sql.XADataSource;

/**
 * The check at start: under Narayana, commitment ordering is enforced by the engines only
 * (pg_co / mysql_co, "engine mode"). Client mode, which the cotx coordinator daemon runs
 * where neither can be installed (managed databases), needs helper transactions that the
 * daemon prepares for each branch; Narayana is its own transaction manager and cannot
 * prepare them. A data source without the engine's enforcement is therefore refused by name,
 * never run as plain 2PC by accident. The same conditions as the daemon's probe:
 * <ul>
 *   <li>PostgreSQL: pg_co in {@code shared_preload_libraries} and loaded (its settings exist:
 *       {@code pg_settings} has no row for a library that is not loaded), {@code pg_co.enabled}
 *       on, {@code pg_co.observe_only} off;</li>
 *   <li>MariaDB: mysql_co ACTIVE in {@code information_schema.PLUGINS},
 *       {@code @@global.mysql_co_enabled} ON, {@code @@global.mysql_co_observe_only} OFF,
 *       status {@code Mysql_co_health} OK.</li>
 * </ul>
 */
public final class EngineEnforcement {
    private EngineEnforcement() {}

    /** A resource without engine-side enforcement; the message names each one and what is missing. */
    public static final class Missing extends IllegalStateException {
        Missing(String message) {
            super(message);
        }
    }

    /**
     * Checks every data source (name: how the application calls the resource, used in the
     * message) and throws {@link Missing} naming each one whose engine does not enforce.
     *
     * @throws SQLException a data source could not be asked
     */
    public static void require(Map<String, XADataSource> resources) throws SQLException {
        List<String> refused = new ArrayList<>();
        for (Map.Entry<String, XADataSource> r : resources.entrySet()) {
            String[] missing = missing(r.getValue());
            if (missing != null) {
                refused.add("resource " + r.getKey() + " needs " + missing[0] + " (engine mode), but " + missing[1]
                        + ": client mode is not implemented for Narayana; see docs/client-mode.md");
            }
        }
        if (!refused.isEmpty()) {
            throw new Missing(String.join("; ", refused));
        }
    }

    /** {extension, what is missing}, or null when the engine enforces commitment ordering. */
    static String[] missing(XADataSource ds) throws SQLException {
        XAConnection xc = ds.getXAConnection();
        try (Connection c = xc.getConnection(); Statement s = c.createStatement()) {
            String product = c.getMetaData().getDatabaseProductName();
            if (product.contains("PostgreSQL")) {
                String why = pgCo(s);
                return why == null ? null : new String[] {"pg_co", why};
            }
            if (product.contains("MariaDB") || product.contains("MySQL")) {
                String why = mysqlCo(s);
                return why == null ? null : new String[] {"mysql_co", why};
            }
            return new String[] {"pg_co or mysql_co", "it is " + product};
        } finally {
            xc.close();
        }
    }

    private static String pgCo(Statement s) throws SQLException {
        try (ResultSet rs = s.executeQuery(
                "SELECT (SELECT setting FROM pg_settings WHERE name = 'pg_co.enabled'), "
                        + "(SELECT setting FROM pg_settings WHERE name = 'pg_co.observe_only'), "
                        + "current_setting('shared_preload_libraries')")) {
            rs.next();
            String enabled = rs.getString(1);
            String observe = rs.getString(2);
            boolean preloaded = false;
            for (String lib : rs.getString(3).split(",")) {
                preloaded |= lib.trim().replace("\"", "").equals("pg_co");
            }
            if (!preloaded) {
                return "pg_co is not in shared_preload_libraries";
            }
            if (enabled == null) {
                return "pg_co is not loaded";
            }
            if (!enabled.equals("on")) {
                return "pg_co.enabled = " + enabled;
            }
            if ("on".equals(observe)) {
                return "pg_co.observe_only = on (pg_co refuses nothing)";
            }
            return null;
        }
    }

    private static String mysqlCo(Statement s) throws SQLException {
        try (ResultSet rs = s.executeQuery(
                "SELECT PLUGIN_STATUS FROM information_schema.PLUGINS WHERE PLUGIN_NAME = 'mysql_co'")) {
            if (!rs.next()) {
                return "mysql_co is not installed";
            }
            if (!rs.getString(1).equals("ACTIVE")) {
                return "mysql_co is " + rs.getString(1);
            }
        }
        try (ResultSet rs = s.executeQuery("SELECT @@global.mysql_co_enabled, @@global.mysql_co_observe_only")) {
            rs.next();
            if (rs.getLong(1) == 0) {
                return "mysql_co_enabled = OFF";
            }
            if (rs.getLong(2) != 0) {
                return "mysql_co_observe_only = ON (mysql_co refuses nothing)";
            }
        }
        try (ResultSet rs = s.executeQuery("SHOW GLOBAL STATUS LIKE 'Mysql_co_health'")) {
            String health = rs.next() ? rs.getString(2) : "missing";
            return health.equals("OK") ? null : "Mysql_co_health = " + health;
        }
    }
}
