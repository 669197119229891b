package io.cotx.spring;

import io.cotx.client.Coordinator;
import org.springframework.boot.actuate.health.AbstractHealthIndicator;
import org.springframework.boot.actuate.health.Health;

/** Actuator health "cotx": up when the daemon answers {@code GET /healthz}, down (with the
 * error) when it cannot be reached; the URL in the details. */
public class CotxHealthIndicator extends AbstractHealthIndicator {
    private final Coordinator coord;

    public CotxHealthIndicator(Coordinator coord) {
        super("cotx coordinator health check failed");
        this.coord = coord;
    }

    @Override
    protected void doHealthCheck(Health.Builder builder) {
        builder.withDetail("url", coord.url());
        coord.health();
        builder.up();
    }
}
