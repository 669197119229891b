package io.cotx.spring.bank;

import io.cotx.client.TransactionAbortedException;
import java.util.Map;
import org.springframework.http.ResponseEntity;
import org.springframework.web.bind.annotation.ExceptionHandler;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestParam;
import org.springframework.web.bind.annotation.RestController;

/** The peer's view of the account: POST /read?user= inside the caller's global transaction
 * (the {@code Cotx-Gtid} header): the balance and the log of withdrawal ids; 409 when its
 * branch was refused or conflicted, so the caller retries. */
@RestController
public class AccountController {
    private final AccountService accounts;

    public AccountController(AccountService accounts) {
        this.accounts = accounts;
    }

    @PostMapping("/read")
    public Map<String, Object> read(@RequestParam("user") String user) {
        Map<String, Object> row = accounts.row(user);
        return Map.of("balance", row.get("bal"), "log", row.get("log"));
    }

    @ExceptionHandler(Exception.class)
    public ResponseEntity<String> failed(Exception e) {
        // The starter turns a retryable failure of the participant into a retryable abort.
        return ResponseEntity.status(e instanceof TransactionAbortedException a && a.retryable() ? 409 : 500).body(String.valueOf(e));
    }
}
