package io.cotx.client;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

/** The daemon's traceparent rule, no servers. */
class TraceparentTest {
    @Test
    void rule() {
        assertTrue(Traceparent.valid("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        assertFalse(Traceparent.valid("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01")); // uppercase
        assertFalse(Traceparent.valid("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"));
        assertFalse(Traceparent.valid("00-00000000000000000000000000000000-00f067aa0ba902b7-01"));
        assertFalse(Traceparent.valid("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"));
        assertFalse(Traceparent.valid("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"));
        assertFalse(Traceparent.valid(null));
        assertTrue(Traceparent.valid(Traceparent.child(Traceparent.randomHex(16))));
    }
}
