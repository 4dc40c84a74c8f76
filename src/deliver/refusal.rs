//! What a broker refusing a connection for security reasons (TLS or SASL) becomes, for the
//! dispatchers and the metadata fetcher alike: a counter, a reason `/health` shows until
//! some broker lets us in, and the sentence to log. Retrying soon will not help, so callers
//! back off as for an unreachable broker and log it rate-limited.

use crate::kafka::{ConnError, SecurityFailure};
use crate::report::metrics::{Counter, Metrics};

/// Counts and records `e` if it is a TLS or SASL failure of `who` (e.g. "broker 1
/// (127.0.0.1:9093)") at `addr`; returns the sentence to log. `None` for any other error.
pub fn note(metrics: &Metrics, who: &str, addr: &str, e: &ConnError) -> Option<String> {
    let (counter, sentence) = match e.security_failure()? {
        SecurityFailure::Auth => (
            Counter::ConnectorAuthFail,
            format!("cannot authenticate to {who}: {e}"),
        ),
        SecurityFailure::Tls => (
            Counter::ConnectorTlsFail,
            format!("no TLS connection to {who}: {e}"),
        ),
    };
    metrics.inc(counter);
    metrics.security_failed(addr, sentence.clone());
    Some(sentence)
}

/// Records that a connection to `addr` passed TLS and SASL (a no-op without them).
pub fn passed(metrics: &Metrics, addr: &str) {
    metrics.security_ok(addr);
}
