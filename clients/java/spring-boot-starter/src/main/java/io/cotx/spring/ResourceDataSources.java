package io.cotx.spring;

import com.zaxxer.hikari.HikariDataSource;
import java.util.Map;
import javax.sql.DataSource;
import org.springframework.beans.factory.BeanFactory;
import org.springframework.beans.factory.support.BeanDefinitionRegistry;
import org.springframework.beans.factory.support.RootBeanDefinition;
import org.springframework.boot.context.properties.bind.Bindable;
import org.springframework.boot.context.properties.bind.Binder;
import org.springframework.context.EnvironmentAware;
import org.springframework.context.annotation.ImportBeanDefinitionRegistrar;
import org.springframework.core.env.Environment;
import org.springframework.core.type.AnnotationMetadata;

/** Registers one {@link BranchDataSource} bean per {@code cotx.resources.<name>}, named
 * {@code <name>DataSource}: over a HikariCP pool of its own ({@code url}, {@code username},
 * {@code password}, {@code maximum-pool-size}), or over the application's DataSource bean
 * named by {@code data-source}. Registered before the beans are made, from the bound
 * properties, while the auto-configurations are read: Boot's DataSource auto-configuration,
 * which comes after the starter's, then sees them and backs off, and its JdbcTemplate uses a
 * lone one. */
class ResourceDataSources implements ImportBeanDefinitionRegistrar, EnvironmentAware {
    private Environment env;

    @Override
    public void setEnvironment(Environment environment) {
        this.env = environment;
    }

    @Override
    public void registerBeanDefinitions(AnnotationMetadata metadata, BeanDefinitionRegistry registry) {
        Map<String, CotxProperties.Resource> resources = Binder.get(env)
                .bind("cotx.resources", Bindable.mapOf(String.class, CotxProperties.Resource.class)).orElse(Map.of());
        BeanFactory factory = (BeanFactory) registry;
        resources.forEach((name, r) -> {
            if (r.getUrl() == null && r.getDataSource() == null) {
                throw new IllegalStateException("cotx.resources." + name + " needs url (a pool of its own) or data-source (a bean)");
            }
            RootBeanDefinition def = new RootBeanDefinition(BranchDataSource.class,
                    () -> new BranchDataSource(name, r.getUrl() != null ? pool(name, r) : factory.getBean(r.getDataSource(), DataSource.class),
                            r.getIsolation()));
            registry.registerBeanDefinition(name + "DataSource", def);
        });
    }

    private static DataSource pool(String name, CotxProperties.Resource r) {
        HikariDataSource h = new HikariDataSource();
        h.setPoolName("cotx-" + name);
        h.setJdbcUrl(r.getUrl());
        h.setUsername(r.getUsername());
        h.setPassword(r.getPassword());
        h.setMaximumPoolSize(r.getMaximumPoolSize());
        // Connections are opened on first use: the application starts when a database is down.
        h.setInitializationFailTimeout(-1);
        return h;
    }
}
