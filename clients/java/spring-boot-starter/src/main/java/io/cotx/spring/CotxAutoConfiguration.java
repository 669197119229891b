package io.cotx.spring;

import io.cotx.client.Coordinator;
import io.micrometer.core.instrument.MeterRegistry;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.beans.factory.SmartInitializingSingleton;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnWebApplication;
import org.springframework.boot.autoconfigure.jdbc.DataSourceAutoConfiguration;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.boot.web.client.RestClientCustomizer;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.context.annotation.Import;
import org.springframework.web.servlet.config.annotation.InterceptorRegistry;
import org.springframework.web.servlet.config.annotation.WebMvcConfigurer;

/** The starter: a {@link Coordinator} from {@code cotx.*}, a {@link BranchDataSource} bean per
 * {@code cotx.resources.<name>} (named {@code <name>DataSource}), the
 * {@link GlobalTransactional} aspect; with Spring MVC the incoming gtid, with RestClient the
 * outgoing one; with Micrometer the counters; with Actuator the health indicator. Before
 * Boot's DataSource auto-configuration, which backs off when these DataSources exist. */
@AutoConfiguration(before = DataSourceAutoConfiguration.class)
@EnableConfigurationProperties(CotxProperties.class)
@Import(ResourceDataSources.class)
public class CotxAutoConfiguration {
    /** With {@code cotx.one-request}, acknowledgements held for the next commit are sent when
     * the context closes (flushAcks; one never sent is confirmed by the daemon later). */
    @Bean(destroyMethod = "flushAcks")
    @ConditionalOnMissingBean
    public Coordinator cotxCoordinator(CotxProperties p) {
        Coordinator.Builder b = Coordinator.builder(p.getUrl()).token(p.getToken()).requestTimeout(p.getRequestTimeout())
                .decisionTimeout(p.getDecisionTimeout()).oneRequest(p.isOneRequest()).leaseCount(p.getLeaseCount());
        if (p.getTokenFile() != null) {
            b.tokenFile(p.getTokenFile());
        }
        if (p.getCaFile() != null) {
            b.caFile(p.getCaFile());
        }
        return b.build();
    }

    /** Participants wait for the root's decision here, after they answered the request. */
    @Bean(destroyMethod = "shutdown")
    public ExecutorService cotxFinisher() {
        return Executors.newCachedThreadPool(r -> {
            Thread t = new Thread(r, "cotx-finish");
            t.setDaemon(true);
            return t;
        });
    }

    @Bean
    public GlobalTransactionalAspect cotxGlobalTransactionalAspect(Coordinator coord, CotxProperties p) {
        return new GlobalTransactionalAspect(coord, p, cotxFinisher());
    }

    /** The counters go to the application's MeterRegistry, looked up once every singleton
     * exists: Boot's metrics auto-configuration makes the registry after this one, so a
     * condition on the bean here would never see it. */
    @Configuration(proxyBeanMethods = false)
    @ConditionalOnClass(MeterRegistry.class)
    static class Metrics {
        @Bean
        SmartInitializingSingleton cotxMetricsBinder(Coordinator coord, ObjectProvider<MeterRegistry> registry) {
            return () -> registry.ifUnique(r -> coord.addListener(new CotxMetrics(r)));
        }
    }

    @Configuration(proxyBeanMethods = false)
    @ConditionalOnClass(name = "org.springframework.boot.actuate.health.AbstractHealthIndicator")
    static class Health {
        @Bean
        @ConditionalOnMissingBean(name = "cotxHealthIndicator")
        CotxHealthIndicator cotxHealthIndicator(Coordinator coord) {
            return new CotxHealthIndicator(coord);
        }
    }

    @Configuration(proxyBeanMethods = false)
    @ConditionalOnWebApplication(type = ConditionalOnWebApplication.Type.SERVLET)
    @ConditionalOnClass(WebMvcConfigurer.class)
    static class WebMvc implements WebMvcConfigurer {
        @Override
        public void addInterceptors(InterceptorRegistry registry) {
            registry.addInterceptor(new GtidHandlerInterceptor());
        }
    }

    @Configuration(proxyBeanMethods = false)
    @ConditionalOnClass(name = {"org.springframework.web.client.RestClient", "org.springframework.boot.web.client.RestClientCustomizer"})
    static class Rest {
        @Bean
        RestClientCustomizer cotxRestClientCustomizer() {
            return builder -> builder.requestInterceptor(new GtidClientInterceptor());
        }
    }
}
