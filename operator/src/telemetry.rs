//! Logs (plain or JSON on stderr, set up as the agent's: [`kiln_endpoints::logging`]) and, when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set, tracing spans exported over OTLP/HTTP (protobuf) by a
//! batch processor on the tokio runtime. The returned guard flushes spans on drop.

/// The `--log-format` value, shared with the agent.
pub use kiln_endpoints::logging::LogFormat;
use kiln_endpoints::logging::{env_filter, fmt_layer};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Flushes and shuts the span exporter down when dropped.
pub struct Guard(Option<SdkTracerProvider>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = p.shutdown();
        }
    }
}

/// Installs the global subscriber. Call it inside the tokio runtime (the exporter runs there), and
/// drop the guard while the runtime is still up.
pub fn init(format: LogFormat) -> anyhow::Result<Guard> {
    let provider = match std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT") {
        Ok(endpoint) if !endpoint.is_empty() => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .build()?;
            Some(
                SdkTracerProvider::builder()
                    .with_span_processor(
                        opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
                            exporter,
                            opentelemetry_sdk::runtime::Tokio,
                        )
                        .build(),
                    )
                    .with_resource(
                        opentelemetry_sdk::Resource::builder()
                            .with_service_name("kiln-operator")
                            .build(),
                    )
                    .build(),
            )
        }
        _ => None,
    };
    let otel = provider
        .as_ref()
        .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("kiln-operator")));
    tracing_subscriber::registry()
        .with(env_filter())
        .with(fmt_layer(format))
        .with(otel)
        .try_init()?;
    if provider.is_some() {
        tracing::info!("exporting spans over OTLP");
    }
    Ok(Guard(provider))
}
