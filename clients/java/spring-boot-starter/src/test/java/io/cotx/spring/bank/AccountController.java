package io.cotx.spring.bank;

import io.cotx.client.TransactionAbortedException;
import java.util.Map;
import org.springframework.http.ResponseEntity;
import org.springframework.web.bind.annotation.ExceptionHandler;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestParam;
import org.springframework.web.bind.annotation.RestController;

/** The peer's view of the account: POST /read?user= inside the caller's global transaction
 * (the {@code Cotx-Gtid} header); 409 when its branch was refused or conflicted, so the
 * caller retries. */
@RestController
public class AccountController {
    private final AccountService accounts;

    public AccountController(AccountService accounts) {
        this.accounts = accounts;
    }

    @PostMapping("/read")
    public Map<String, Integer> read(@RequestParam("user") String user) {
        return Map.of("balance", accounts.balance(user));
    }

    @ExceptionHandler(Exception.class)
    public ResponseEntity<String> failed(Exception e) {
        // The starter turns a retryable failure of the participant into a retryable abort.
        return ResponseEntity.status(e instanceof TransactionAbortedException a && a.retryable() ? 409 : 500).body(String.valueOf(e));
    }
}
