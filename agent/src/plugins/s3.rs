//! `s3://bucket/key` for the downloader, through `object_store`.
//!
//! Credentials come only from the environment (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`) or the instance's role
//! (web identity, container or instance metadata); the endpoint, region and
//! addressing style from `storage.s3`, else `AWS_ENDPOINT_URL` and
//! `AWS_REGION`.

use super::contract::PluginError;
use super::params::io_err;
use crate::config::S3Conf;
use futures::StreamExt;
use object_store::{aws::AmazonS3Builder, ObjectStore, RetryConfig};
use std::path::Path;
use std::time::Duration;

fn store(conf: &S3Conf, bucket: &str) -> Result<impl ObjectStore, PluginError> {
    let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket).with_retry(RetryConfig {
        // The step's own retries (with their backoff and record) do the rest.
        max_retries: 2,
        retry_timeout: Duration::from_secs(10),
        ..Default::default()
    });
    if let Some(region) = &conf.region {
        b = b.with_region(region);
    } else if std::env::var_os("AWS_REGION").is_none() && std::env::var_os("AWS_DEFAULT_REGION").is_none() {
        b = b.with_region("us-east-1");
    }
    let endpoint = conf.endpoint.clone().or_else(|| std::env::var("AWS_ENDPOINT_URL").ok());
    match endpoint {
        Some(e) => {
            let http = e.starts_with("http://");
            let path_style = conf.path_style_for(&e);
            // Virtual-hosted addressing puts the bucket in the host name.
            let e = if path_style {
                e
            } else {
                match e.split_once("://") {
                    Some((scheme, host)) => format!("{scheme}://{bucket}.{host}"),
                    None => e,
                }
            };
            b = b.with_endpoint(e).with_allow_http(http).with_virtual_hosted_style_request(!path_style);
        }
        None => b = b.with_virtual_hosted_style_request(!conf.path_style.unwrap_or(false)),
    }
    b.build().map_err(|e| PluginError::permanent(format!("s3://{bucket}: the S3 settings are not usable: {e}")))
}

/// The server's own words: `Code: Message` from an S3 error document, else
/// the error's text on one line.
fn server_says(e: &dyn std::fmt::Display) -> String {
    let text = e.to_string();
    let tag = |t: &str| {
        let (open, close) = (format!("<{t}>"), format!("</{t}>"));
        let start = text.find(&open)? + open.len();
        Some(text[start..].split(&close).next()?.to_string())
    };
    match (tag("Code"), tag("Message")) {
        (Some(code), Some(msg)) => format!("{code}: {msg}"),
        (Some(code), None) => code,
        _ => text.split_whitespace().collect::<Vec<_>>().join(" "),
    }
}

/// Why a GET failed, and whether trying again could help.
fn get_error(url: &str, e: object_store::Error) -> PluginError {
    use object_store::Error as E;
    let creds = if std::env::var_os("AWS_ACCESS_KEY_ID").is_some() {
        "the credentials in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
    } else {
        "the instance's role (AWS_ACCESS_KEY_ID is not set)"
    };
    match e {
        E::NotFound { .. } => PluginError::permanent(format!("{url}: no such object (check the bucket and key)")),
        E::PermissionDenied { source, .. } | E::Unauthenticated { source, .. } => {
            PluginError::permanent(format!("{url}: access denied to {creds} ({})", server_says(&source)))
        }
        other => PluginError::retryable(format!("{url}: {}", server_says(&other))),
    }
}

/// Streams the object to `tmp` and syncs it.
pub async fn fetch(conf: &S3Conf, bucket: &str, key: &str, tmp: &Path) -> Result<(), PluginError> {
    use tokio::io::AsyncWriteExt;
    let url = format!("s3://{bucket}/{key}");
    let store = store(conf, bucket)?;
    let got = store.get(&object_store::path::Path::from(key)).await.map_err(|e| get_error(&url, e))?;
    let mut body = got.into_stream();
    let mut f = tokio::fs::File::create(tmp).await.map_err(|e| io_err("cannot create", tmp, e))?;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| get_error(&url, e))?;
        f.write_all(&chunk).await.map_err(|e| io_err("cannot write", tmp, e))?;
    }
    f.sync_all().await.map_err(|e| io_err("cannot sync", tmp, e))
}
