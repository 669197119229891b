package io.cotx.spring.bank;

import io.cotx.client.TransactionAbortedException;
import io.cotx.spring.GlobalTransactional;
import io.cotx.spring.GlobalTransactions;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.stereotype.Service;
import org.springframework.web.client.RestClient;

/** The account's two operations, each a global transaction: the balance (a participant when
 * the peer asks for it with the gtid header) and the withdrawal (the root: reads its balance,
 * asks the peer for the other, declines or debits; run again by the starter when aborted
 * retryably). */
@Service
public class AccountService {
    public static final int AMOUNT = 80;

    /** The application's decision not to withdraw: not retried, rolled back. */
    public static class Declined extends RuntimeException {
        Declined() {
            super("declined");
        }
    }

    private final JdbcTemplate jdbc;
    private final RestClient peer;
    private final String account;
    private final AtomicReference<String> peerUrl = new AtomicReference<>();

    public AccountService(JdbcTemplate jdbc, RestClient peerClient, @Value("${bank.account}") String account) {
        this.jdbc = jdbc;
        this.peer = peerClient;
        this.account = account;
    }

    /** Set by the test once both services listen (a method: the bean is an AOP proxy). */
    public void setPeerUrl(String url) {
        peerUrl.set(url);
    }

    /** The account's row: balance and the ids of the withdrawals that debited it. */
    @GlobalTransactional
    public Map<String, Object> row(String user) {
        return jdbc.queryForMap("SELECT bal, log FROM " + account + " WHERE u = ?", user);
    }

    /** Withdraws AMOUNT for {@code user}; {@code attempts} gets each attempt (its id, also
     * written into the row's log when it debits, and what it read, for the history checker);
     * the first attempt meets the peer's withdrawal at {@code lineup} between its reads and
     * its write. Returns the committed attempt's id. */
    @GlobalTransactional(retries = 4)
    public String withdraw(String user, String tag, CountDownLatch lineup, List<Attempt> attempts) throws InterruptedException {
        Attempt a = new Attempt(tag + "." + GlobalTransactions.attempt());
        String tid = a.tid;
        attempts.add(a);
        Map<String, Object> own = row(user);
        a.reads.put(account + ":" + user, Attempt.parse(String.valueOf(own.get("log"))));
        int mine = ((Number) own.get("bal")).intValue();
        Map<?, ?> peerRow = askPeer(user);
        a.reads.put((account.equals("savings") ? "checking" : "savings") + ":" + user, Attempt.parse(String.valueOf(peerRow.get("log"))));
        int other = ((Number) peerRow.get("balance")).intValue();
        if (GlobalTransactions.attempt() == 1) {
            lineup.countDown();
            lineup.await(5, TimeUnit.SECONDS);
        }
        if (mine + other - AMOUNT < 0) {
            throw new Declined();
        }
        String update = account.equals("savings") ? "UPDATE savings SET bal = bal - ?, log = log || ' ' || ? WHERE u = ?"
                : "UPDATE checking SET bal = bal - ?, log = CONCAT(log, ' ', ?) WHERE u = ?";
        jdbc.update(update, AMOUNT, tid, user);
        a.appendedTo = account + ":" + user;
        return tid;
    }

    private Map<?, ?> askPeer(String user) {
        Map<?, ?> r = peer.post().uri(peerUrl.get() + "/read?user={u}", user).retrieve()
                .onStatus(s -> s.value() == 409, (req, resp) -> {
                    // the peer's branch was refused or conflicted: as retryable as our own
                    throw new TransactionAbortedException(GlobalTransactions.current().gtid(), "peer refused", true, false, null);
                })
                .body(Map.class);
        return r;
    }
}
