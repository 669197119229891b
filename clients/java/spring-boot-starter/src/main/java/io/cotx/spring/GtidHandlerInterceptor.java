package io.cotx.spring;

import io.cotx.client.Propagation;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import org.springframework.web.servlet.HandlerInterceptor;

/** Spring MVC, incoming side: a request's {@code Cotx-Gtid} (and its {@code traceparent}) are
 * kept for the request's thread, so a {@code @GlobalTransactional} method it calls joins that
 * global transaction as a participant instead of beginning one. */
public class GtidHandlerInterceptor implements HandlerInterceptor {
    @Override
    public boolean preHandle(HttpServletRequest request, HttpServletResponse response, Object handler) {
        String gtid = Propagation.gtidFrom(request::getHeader);
        GlobalTransactions.setIncoming(gtid == null ? null
                : new GlobalTransactions.Incoming(gtid, Propagation.traceparentFrom(request::getHeader)));
        return true;
    }

    @Override
    public void afterCompletion(HttpServletRequest request, HttpServletResponse response, Object handler, Exception ex) {
        GlobalTransactions.setIncoming(null);
    }
}
