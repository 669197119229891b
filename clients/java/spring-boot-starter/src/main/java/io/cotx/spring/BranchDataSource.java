package io.cotx.spring;

import io.cotx.client.Isolation;
import java.io.PrintWriter;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Proxy;
import java.sql.Connection;
import java.sql.SQLException;
import java.sql.SQLFeatureNotSupportedException;
import java.util.logging.Logger;
import javax.sql.DataSource;

/** A resource's DataSource (the bean the application injects, e.g. into a JdbcTemplate) over
 * its pool. Inside a global transaction, {@link #getConnection()} returns the transaction's
 * branch on this resource: the first call takes a pooled connection and opens the branch on it
 * (registration, SERIALIZABLE, BEGIN / XA START), later calls return the same connection; its
 * {@code close()} does nothing, and the connection goes back to the pool when the transaction
 * has ended here (after the decision: a MariaDB branch dies with its session). Outside one it
 * is the pool's plain connection, for local work. */
public final class BranchDataSource implements DataSource {
    private final String resource;
    private final DataSource pool;
    private final Isolation isolation;

    public BranchDataSource(String resource, DataSource pool, Isolation isolation) {
        this.resource = resource;
        this.pool = pool;
        this.isolation = isolation;
    }

    /** The resource's name at the daemon. */
    public String resource() {
        return resource;
    }

    /** The pool underneath (HikariCP unless the application gave its own). */
    public DataSource pool() {
        return pool;
    }

    @Override
    public Connection getConnection() throws SQLException {
        GlobalTransactions.Scope s = GlobalTransactions.scope();
        if (s == null) {
            return pool.getConnection();
        }
        Connection c = s.connections.get(resource);
        if (c == null) {
            c = pool.getConnection();
            try {
                s.tx.branch(c, resource, isolation, null);
            } catch (RuntimeException e) {
                c.close();
                throw e;
            }
            s.connections.put(resource, c);
        }
        return held(c);
    }

    @Override
    public Connection getConnection(String username, String password) throws SQLException {
        throw new SQLFeatureNotSupportedException("a cotx resource's connections use the pool's credentials");
    }

    /** The branch's connection as the application sees it: close() is the transaction's. */
    private static Connection held(Connection c) {
        return (Connection) Proxy.newProxyInstance(Connection.class.getClassLoader(), new Class<?>[] {Connection.class},
                (proxy, m, args) -> {
                    switch (m.getName()) {
                        case "close":
                            return null;
                        case "isClosed":
                            return c.isClosed();
                        case "commit":
                        case "rollback":
                        case "setAutoCommit":
                            if (m.getName().equals("rollback") && args != null && args.length == 1) {
                                break;
                            }
                            throw new SQLException("a cotx branch is committed or rolled back by its global transaction, not by "
                                    + m.getName() + "()");
                        case "unwrap":
                            if (((Class<?>) args[0]).isInstance(proxy)) {
                                return proxy;
                            }
                            break;
                        default:
                            break;
                    }
                    try {
                        return m.invoke(c, args);
                    } catch (InvocationTargetException e) {
                        throw e.getCause();
                    }
                });
    }

    @Override
    public PrintWriter getLogWriter() throws SQLException {
        return pool.getLogWriter();
    }

    @Override
    public void setLogWriter(PrintWriter out) throws SQLException {
        pool.setLogWriter(out);
    }

    @Override
    public void setLoginTimeout(int seconds) throws SQLException {
        pool.setLoginTimeout(seconds);
    }

    @Override
    public int getLoginTimeout() throws SQLException {
        return pool.getLoginTimeout();
    }

    @Override
    public Logger getParentLogger() throws SQLFeatureNotSupportedException {
        return pool.getParentLogger();
    }

    @Override
    public <T> T unwrap(Class<T> iface) throws SQLException {
        return iface.isInstance(this) ? iface.cast(this) : pool.unwrap(iface);
    }

    @Override
    public boolean isWrapperFor(Class<?> iface) throws SQLException {
        return iface.isInstance(this) || pool.isWrapperFor(iface);
    }
}
