//! The coordinator's REST API for users and scripts (JSON; `docs/api/openapi.yaml`).
//!
//! Errors are JSON objects `{"error": "...", "field": "..."}` with 400 for a bad request
//! (naming the field), 404 for an unknown job, 409 for a request the job cannot take
//! now, 500 otherwise.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;
use sluice_common::job_spec;
use tokio::net::TcpListener;

use crate::service::{ApiError, Coordinator, SubmitOptions};

/// The OpenAPI description of this API.
pub const OPENAPI: &str = include_str!("../../docs/api/openapi.yaml");

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (code, body) = match &self {
            ApiError::BadRequest { field, message } => (
                StatusCode::BAD_REQUEST,
                json!({ "error": message, "field": field }),
            ),
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, json!({ "error": m })),
            ApiError::Conflict(m) => (StatusCode::CONFLICT, json!({ "error": m })),
            ApiError::Internal(m) => (StatusCode::INTERNAL_SERVER_ERROR, json!({ "error": m })),
        };
        (code, axum::Json(body)).into_response()
    }
}

type ApiResult = Result<Response, ApiError>;

fn ok(value: impl serde::Serialize) -> ApiResult {
    Ok(axum::Json(value).into_response())
}

/// Parses a JSON body; serde's message names the field and position.
fn body<T: serde::de::DeserializeOwned>(bytes: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        let field = e
            .to_string()
            .split('`')
            .nth(1)
            .unwrap_or("body")
            .to_string();
        ApiError::bad(&field, format!("invalid request body: {e}"))
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubmitRequest {
    /// The job file's text (YAML).
    job: String,
    /// The job file's name, for error messages.
    #[serde(default)]
    file: Option<String>,
    #[serde(default)]
    workers: Option<usize>,
    #[serde(default)]
    parallelism: Option<u32>,
    #[serde(default)]
    from_savepoint: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SavepointRequest {
    name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StopRequest {
    #[serde(default)]
    savepoint: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RescaleRequest {
    parallelism: u32,
}

async fn submit(State(c): State<Arc<Coordinator>>, bytes: Bytes) -> ApiResult {
    let req: SubmitRequest = body(&bytes)?;
    let file = req.file.unwrap_or_else(|| "job".into());
    let graph =
        job_spec::parse_job(&file, &req.job).map_err(|e| ApiError::bad("job", e.to_string()))?;
    let id = c
        .submit(
            graph,
            SubmitOptions {
                workers: req.workers,
                from_savepoint: req.from_savepoint,
                parallelism: req.parallelism,
                job_id: None,
            },
        )
        .await?;
    Ok((StatusCode::CREATED, axum::Json(json!({ "id": id }))).into_response())
}

async fn jobs(State(c): State<Arc<Coordinator>>) -> ApiResult {
    ok(c.jobs())
}

async fn job(State(c): State<Arc<Coordinator>>, Path(id): Path<String>) -> ApiResult {
    ok(c.status(&id)?)
}

async fn checkpoints(State(c): State<Arc<Coordinator>>, Path(id): Path<String>) -> ApiResult {
    ok(c.status(&id)?.checkpoints)
}

async fn cancel(State(c): State<Arc<Coordinator>>, Path(id): Path<String>) -> ApiResult {
    c.cancel(&id).await?;
    ok(c.status(&id)?)
}

async fn savepoint(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> ApiResult {
    let req: SavepointRequest = body(&bytes)?;
    let path = c.savepoint(&id, &req.name).await?;
    ok(json!({ "path": path }))
}

async fn stop(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> ApiResult {
    let req: StopRequest = if bytes.is_empty() {
        StopRequest { savepoint: None }
    } else {
        body(&bytes)?
    };
    ok(c.stop(&id, req.savepoint).await?)
}

async fn rescale(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
    bytes: Bytes,
) -> ApiResult {
    let req: RescaleRequest = body(&bytes)?;
    ok(c.rescale(&id, req.parallelism).await?)
}

async fn workers(State(c): State<Arc<Coordinator>>) -> ApiResult {
    ok(c.workers())
}

async fn openapi() -> Response {
    ([("content-type", "application/yaml")], OPENAPI).into_response()
}

async fn not_found() -> ApiResult {
    Err(ApiError::NotFound(
        "no such endpoint; see /v1/openapi.yaml".into(),
    ))
}

/// The API's routes.
pub fn router(c: Arc<Coordinator>) -> Router {
    Router::new()
        .route("/v1/jobs", get(jobs).post(submit))
        .route("/v1/jobs/{id}", get(job))
        .route("/v1/jobs/{id}/checkpoints", get(checkpoints))
        .route("/v1/jobs/{id}/cancel", post(cancel))
        .route("/v1/jobs/{id}/savepoints", post(savepoint))
        .route("/v1/jobs/{id}/stop", post(stop))
        .route("/v1/jobs/{id}/rescale", post(rescale))
        .route("/v1/workers", get(workers))
        .route("/v1/openapi.yaml", get(openapi))
        .fallback(not_found)
        .with_state(c)
}

/// Serves the API on `listener` until the process ends.
pub fn serve(c: Arc<Coordinator>, listener: TcpListener) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router(c)).await {
            tracing::error!("the coordinator's REST server stopped: {e}");
        }
    })
}
