//! The daemon's counters as OTLP metrics: the same samples `GET /metrics` shows, read by the
//! SDK's periodic reader, exported on telemetry's runtime.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Temporality};

pub use promptd_daemon::metrics::Sample;

/// Reads every sample now.
pub type Source = Arc<dyn Fn() -> Vec<Sample> + Send + Sync>;

/// An exporter that runs the OTLP one on telemetry's runtime (the reader's thread has none).
#[derive(Debug)]
struct OnRuntime {
    inner: opentelemetry_otlp::MetricExporter,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
}

impl PushMetricExporter for OnRuntime {
    fn export(
        &self,
        metrics: &ResourceMetrics,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let result = self.runtime.block_on(async {
            tokio::time::timeout(self.timeout, self.inner.export(metrics)).await
        });
        std::future::ready(match result {
            Ok(r) => r,
            Err(_) => Err(OTelSdkError::Timeout(self.timeout)),
        })
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

/// A meter provider exporting `source`'s samples every `interval`; `names` are the metrics
/// `source` gives (instruments are made once, at start).
pub(crate) fn provider(
    exporter: opentelemetry_otlp::MetricExporter,
    runtime: tokio::runtime::Handle,
    settings: &crate::Settings,
    resource: opentelemetry_sdk::Resource,
    source: &Source,
) -> SdkMeterProvider {
    let exporter = OnRuntime {
        inner: exporter,
        runtime,
        timeout: settings.timeout,
    };
    let reader = PeriodicReader::builder(exporter)
        .with_interval(settings.metrics_interval)
        .build();
    let provider = SdkMeterProvider::builder()
        .with_reader(reader)
        .with_resource(resource)
        .build();
    let meter = provider.meter("promptd");
    for sample in source() {
        let (name, source) = (sample.name, source.clone());
        let points = move || {
            source()
                .into_iter()
                .find(|s| s.name == name)
                .map(|s| s.points)
                .unwrap_or_default()
        };
        let attributes = |labels: Vec<(&'static str, String)>| -> Vec<KeyValue> {
            labels
                .into_iter()
                .map(|(k, v)| KeyValue::new(k, v))
                .collect()
        };
        if sample.counter {
            meter
                .u64_observable_counter(name)
                .with_description(sample.help)
                .with_callback(move |o| {
                    for (labels, v) in points() {
                        o.observe(v as u64, &attributes(labels));
                    }
                })
                .build();
        } else {
            meter
                .f64_observable_gauge(name)
                .with_description(sample.help)
                .with_callback(move |o| {
                    for (labels, v) in points() {
                        o.observe(v, &attributes(labels));
                    }
                })
                .build();
        }
    }
    provider
}
