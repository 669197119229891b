//! What the daemon tells the outside: logs (`log`, through `tracing`), Prometheus metrics
//! (`metrics`, with the live-state `gauges` it renders), OTLP span export (`otlp`).

pub mod gauges;
pub mod log;
pub mod metrics;
pub mod otlp;
