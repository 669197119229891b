package io.cotx.spring;

import static org.assertj.core.api.Assertions.assertThat;

import com.zaxxer.hikari.HikariDataSource;
import io.cotx.client.Coordinator;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.simple.SimpleMeterRegistry;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import javax.sql.DataSource;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;
import org.springframework.boot.actuate.health.Status;
import org.springframework.boot.autoconfigure.AutoConfigurations;
import org.springframework.boot.autoconfigure.jdbc.DataSourceAutoConfiguration;
import org.springframework.boot.autoconfigure.jdbc.JdbcTemplateAutoConfiguration;
import org.springframework.boot.test.context.runner.ApplicationContextRunner;
import org.springframework.boot.web.client.RestClientCustomizer;
import org.springframework.jdbc.core.JdbcTemplate;

/** The auto-configuration from properties alone, no servers: the coordinator (token file),
 * a BranchDataSource per resource over its HikariCP pool (Boot's own DataSource backs off, its
 * JdbcTemplate uses ours), the aspect, the RestClient customizer, the counters in the
 * application's MeterRegistry, and the health
 * indicator down for a daemon that is not there. */
class CotxPropertiesTest {
    final ApplicationContextRunner runner = new ApplicationContextRunner().withConfiguration(
            AutoConfigurations.of(CotxAutoConfiguration.class, DataSourceAutoConfiguration.class, JdbcTemplateAutoConfiguration.class));

    static int closedPort() throws Exception {
        try (ServerSocket s = new ServerSocket(0)) {
            return s.getLocalPort();
        }
    }

    @Test
    void beansFromProperties(@TempDir Path dir) throws Exception {
        Path tok = dir.resolve("token");
        Files.writeString(tok, "0123456789abcdef0123\n");
        int port = closedPort();
        runner.withBean(MeterRegistry.class, SimpleMeterRegistry::new)
                .withPropertyValues("cotx.url=http://127.0.0.1:" + port, "cotx.token-file=" + tok,
                        "cotx.resources.savings.url=jdbc:postgresql://127.0.0.1:1/bank", "cotx.resources.savings.username=bank",
                        "cotx.resources.savings.maximum-pool-size=3")
                .run(ctx -> {
                    assertThat(ctx).hasNotFailed();
                    assertThat(ctx.getBean(Coordinator.class).url()).isEqualTo("http://127.0.0.1:" + port);
                    assertThat(ctx.getBeansOfType(DataSource.class)).containsOnlyKeys("savingsDataSource");
                    BranchDataSource ds = ctx.getBean("savingsDataSource", BranchDataSource.class);
                    assertThat(ds.resource()).isEqualTo("savings");
                    HikariDataSource pool = (HikariDataSource) ds.pool();
                    assertThat(pool.getJdbcUrl()).isEqualTo("jdbc:postgresql://127.0.0.1:1/bank");
                    assertThat(pool.getMaximumPoolSize()).isEqualTo(3);
                    assertThat(ctx.getBean(JdbcTemplate.class).getDataSource()).isSameAs(ds);
                    assertThat(ctx).hasSingleBean(GlobalTransactionalAspect.class).hasSingleBean(RestClientCustomizer.class);
                    assertThat(ctx.getBean(MeterRegistry.class).find("cotx.refusals").counter()).isNotNull();
                    assertThat(ctx.getBean(CotxHealthIndicator.class).health().getStatus()).isEqualTo(Status.DOWN);
                });
    }

    @Test
    void aResourceOverTheApplicationsOwnDataSource() {
        runner.withBean("checkingPool", DataSource.class, () -> {
            HikariDataSource h = new HikariDataSource();
            h.setJdbcUrl("jdbc:mariadb://127.0.0.1:1/bank");
            return h;
        }).withPropertyValues("cotx.resources.checking.data-source=checkingPool", "cotx.resources.checking.isolation=repeatable-read")
                .run(ctx -> {
                    assertThat(ctx).hasNotFailed();
                    BranchDataSource ds = ctx.getBean("checkingDataSource", BranchDataSource.class);
                    assertThat(ds.pool()).isSameAs(ctx.getBean("checkingPool"));
                });
    }

    @Test
    void aResourceNeedsAPoolOrABean() {
        runner.withPropertyValues("cotx.resources.savings.username=bank")
                .run(ctx -> assertThat(ctx).getFailure().hasMessageContaining("cotx.resources.savings needs url"));
    }

    @Test
    void oneRequestIsOptIn() {
        // A resource of its own: without one Boot's own DataSource wants a URL.
        String pool = "cotx.resources.savings.url=jdbc:postgresql://127.0.0.1:1/bank";
        runner.withPropertyValues(pool).run(ctx -> assertThat(ctx.getBean(Coordinator.class).oneRequest()).isFalse());
        runner.withPropertyValues(pool, "cotx.one-request=true", "cotx.lease-count=50")
                .run(ctx -> assertThat(ctx.getBean(Coordinator.class).oneRequest()).isTrue());
        runner.withPropertyValues(pool, "cotx.one-request=true", "cotx.lease-count=0")
                .run(ctx -> assertThat(ctx).getFailure().hasMessageContaining("leaseCount must be between 1 and 100000"));
    }

    /** The configuration metadata (IDEs' completion and docs) names every property of
     * CotxProperties, in its kebab-case spelling. */
    @Test
    void metadataNamesEveryProperty() throws Exception {
        com.fasterxml.jackson.databind.JsonNode meta;
        try (java.io.InputStream in = getClass().getResourceAsStream("/META-INF/spring-configuration-metadata.json")) {
            meta = new com.fasterxml.jackson.databind.ObjectMapper().readTree(in);
        }
        java.util.Set<String> listed = new java.util.HashSet<>();
        meta.path("properties").forEach(p -> listed.add(p.path("name").asText()));
        for (java.lang.reflect.Method m : CotxProperties.class.getDeclaredMethods()) {
            if (m.getName().startsWith("set") && m.getParameterCount() == 1) {
                String kebab = m.getName().substring(3).replaceAll("([a-z])([A-Z])", "$1-$2").toLowerCase();
                assertThat(listed).contains("cotx." + kebab);
            }
        }
    }
}
