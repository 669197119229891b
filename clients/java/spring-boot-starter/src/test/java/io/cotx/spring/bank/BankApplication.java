package io.cotx.spring.bank;

import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.context.annotation.Bean;
import org.springframework.web.client.RestClient;

/** One bank service of the two-service overdraft: its account ({@code bank.account}: savings
 * on PostgreSQL or checking on MariaDB) in the resource {@code cotx.resources.<account>}, the
 * peer reached over HTTP with a RestClient the starter adds the gtid header to. The whole
 * cotx part of it is the dependency, the properties and {@code @GlobalTransactional}. */
@SpringBootApplication
public class BankApplication {
    @Bean
    RestClient peerClient(RestClient.Builder builder) {
        return builder.build();
    }
}
