package io.cotx.spring;

import io.cotx.client.Transaction;
import java.io.IOException;
import org.springframework.http.HttpRequest;
import org.springframework.http.client.ClientHttpRequestExecution;
import org.springframework.http.client.ClientHttpRequestInterceptor;
import org.springframework.http.client.ClientHttpResponse;

/** RestClient (and RestTemplate), outgoing side: a call made inside a global transaction
 * carries its gtid ({@code Cotx-Gtid}) and traceparent, so the called service joins it and its
 * requests to the coordinator land in the same trace. A header the caller set wins. The
 * starter adds it to every {@code RestClient.Builder} Spring Boot hands out. */
public class GtidClientInterceptor implements ClientHttpRequestInterceptor {
    @Override
    public ClientHttpResponse intercept(HttpRequest request, byte[] body, ClientHttpRequestExecution execution) throws IOException {
        Transaction tx = GlobalTransactions.current();
        if (tx != null) {
            tx.headers().forEach((k, v) -> {
                if (!request.getHeaders().containsKey(k)) {
                    request.getHeaders().set(k, v);
                }
            });
        }
        return execution.execute(request, body);
    }
}
