package io.cotx.spring.bank;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** One attempt of a withdrawal as the history checker (checker/, Python) reads it: the logs
 * it read (key {@code account:user}, the ids appended so far) and the id it appended, if it
 * got that far. Its status (committed or not) is set from what the service was told. */
public final class Attempt {
    final String tid;
    final Map<String, List<String>> reads = new LinkedHashMap<>();
    String appendedTo;

    Attempt(String tid) {
        this.tid = tid;
    }

    static List<String> parse(String log) {
        List<String> out = new ArrayList<>();
        for (String s : log.trim().split("\\s+")) {
            if (!s.isEmpty()) {
                out.add(s);
            }
        }
        return out;
    }

    /** One line of the checker's JSON lines: {"id", "status", "kind", "note", "ops"}. */
    Map<String, Object> toJson(String status, String note) {
        List<List<Object>> ops = new ArrayList<>();
        reads.forEach((k, v) -> ops.add(List.of("r", k, v)));
        if (appendedTo != null) {
            ops.add(List.of("append", appendedTo, tid));
        }
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("id", tid);
        m.put("status", status);
        m.put("kind", "global");
        m.put("note", note);
        m.put("ops", ops);
        return m;
    }
}
