//! What the daemon tells the outside: logs (`log`, through `tracing`), Prometheus metrics
//! (`metrics`), OTLP span export (`otlp`).

pub mod log;
pub mod metrics;
pub mod otlp;
