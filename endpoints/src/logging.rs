//! Log lines on stderr, the same way in both components: plain (for people) or JSON (for log
//! pipelines), filtered by `RUST_LOG` (default `info`). Plain lines carry ANSI colours only when
//! stderr is a terminal, so `2>file`, a pipe and `kubectl logs` read as text. Installs a global
//! subscriber and nothing else; the operator adds its OTLP span layer on top of these.

use std::io::IsTerminal;

use tracing::Subscriber;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::{SubscriberInitExt, TryInitError};
use tracing_subscriber::{EnvFilter, Layer};

/// Log line format (`--log-format`, `KILN_LOG_FORMAT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable.
    Plain,
    /// One JSON object per line.
    Json,
}

/// The `RUST_LOG` filter; `info` when it is unset or does not parse.
pub fn env_filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"))
}

/// The stderr layer writing `format`.
pub fn fmt_layer<S>(format: LogFormat) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour());
    match format {
        LogFormat::Plain => layer.boxed(),
        LogFormat::Json => layer.json().boxed(),
    }
}

/// Installs [`env_filter`] and [`fmt_layer`] as the global subscriber.
pub fn init(format: LogFormat) -> Result<(), TryInitError> {
    tracing_subscriber::registry()
        .with(env_filter())
        .with(fmt_layer(format))
        .try_init()
}

/// Colour codes only for a person at a terminal, and never under `NO_COLOR`
/// (<https://no-color.org>), which the layer's own default honoured too.
fn colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}
