package io.cotx.spring;

import io.cotx.client.Isolation;
import java.nio.file.Path;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;
import org.springframework.boot.context.properties.ConfigurationProperties;

/** {@code cotx.*} in application.properties:
 * <pre>
 * cotx.url=http://127.0.0.1:7420
 * cotx.token-file=/etc/cotx/client-token        # or cotx.token=…
 * cotx.ca-file=/etc/cotx/ca.pem                 # an https:// daemon with a private CA
 * cotx.retries=5
 * cotx.one-request=true                         # leased gtids: the commit the only request (off by default)
 * cotx.resources.savings.url=jdbc:postgresql://db1:5432/bank   # a HikariCP pool, bean "savingsDataSource"
 * cotx.resources.savings.username=bank
 * cotx.resources.checking.data-source=checkingPool            # or an existing DataSource bean
 * </pre>
 * Each key of {@code cotx.resources} is a resource's name in the daemon's configuration. */
@ConfigurationProperties("cotx")
public class CotxProperties {
    /** The daemon's URL. */
    private String url = "http://127.0.0.1:7420";
    /** The bearer token (the daemon's token or auth.client_token). */
    private String token;
    /** A file holding the token (read at start; wins over {@code token}). */
    private Path tokenFile;
    /** PEM CA certificate(s) an https:// daemon's certificate must chain to. */
    private Path caFile;
    private Duration requestTimeout = Duration.ofSeconds(10);
    /** How long a participant waits for the decision before "outcome unknown". */
    private Duration decisionTimeout = Duration.ofSeconds(120);
    /** Default of {@code @GlobalTransactional(retries)}: more attempts after a retryable abort. */
    private int retries = 5;
    /** The one-request commit (Coordinator.Builder#oneRequest): a transaction on resources
     * seen in engine mode or plain 2PC draws its gtid from a leased range and its commit is
     * its only request to the daemon. Off by default: the daemon's cross-database deadlock
     * detector sees only begun transactions. */
    private boolean oneRequest = false;
    /** Gtids per lease with {@code one-request} (1..100000). */
    private int leaseCount = 1000;
    private Map<String, Resource> resources = new LinkedHashMap<>();

    /** One resource: a HikariCP pool of its own ({@code url}, …) or an existing DataSource bean. */
    public static class Resource {
        /** JDBC URL (pgjdbc or MariaDB Connector/J): the starter makes a HikariCP pool. */
        private String url;
        private String username;
        private String password;
        private int maximumPoolSize = 10;
        /** Instead of {@code url}: the name of a DataSource bean of the application. */
        private String dataSource;
        /** The level the resource's branches run at; only SERIALIZABLE is protected
         * (REPEATABLE_READ is there for plain-2PC comparisons). */
        private Isolation isolation = Isolation.SERIALIZABLE;

        public String getUrl() {
            return url;
        }

        public void setUrl(String url) {
            this.url = url;
        }

        public String getUsername() {
            return username;
        }

        public void setUsername(String username) {
            this.username = username;
        }

        public String getPassword() {
            return password;
        }

        public void setPassword(String password) {
            this.password = password;
        }

        public int getMaximumPoolSize() {
            return maximumPoolSize;
        }

        public void setMaximumPoolSize(int n) {
            this.maximumPoolSize = n;
        }

        public String getDataSource() {
            return dataSource;
        }

        public void setDataSource(String dataSource) {
            this.dataSource = dataSource;
        }

        public Isolation getIsolation() {
            return isolation;
        }

        public void setIsolation(Isolation isolation) {
            this.isolation = isolation;
        }
    }

    public String getUrl() {
        return url;
    }

    public void setUrl(String url) {
        this.url = url;
    }

    public String getToken() {
        return token;
    }

    public void setToken(String token) {
        this.token = token;
    }

    public Path getTokenFile() {
        return tokenFile;
    }

    public void setTokenFile(Path tokenFile) {
        this.tokenFile = tokenFile;
    }

    public Path getCaFile() {
        return caFile;
    }

    public void setCaFile(Path caFile) {
        this.caFile = caFile;
    }

    public Duration getRequestTimeout() {
        return requestTimeout;
    }

    public void setRequestTimeout(Duration d) {
        this.requestTimeout = d;
    }

    public Duration getDecisionTimeout() {
        return decisionTimeout;
    }

    public void setDecisionTimeout(Duration d) {
        this.decisionTimeout = d;
    }

    public int getRetries() {
        return retries;
    }

    public void setRetries(int retries) {
        this.retries = retries;
    }

    public boolean isOneRequest() {
        return oneRequest;
    }

    public void setOneRequest(boolean oneRequest) {
        this.oneRequest = oneRequest;
    }

    public int getLeaseCount() {
        return leaseCount;
    }

    public void setLeaseCount(int leaseCount) {
        this.leaseCount = leaseCount;
    }

    public Map<String, Resource> getResources() {
        return resources;
    }

    public void setResources(Map<String, Resource> resources) {
        this.resources = resources;
    }
}
