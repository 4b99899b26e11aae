//! The coordinator's REST API for users and scripts (JSON; `docs/api/openapi.yaml`),
//! and the web UI over it (`/ui/`: `coordinator/ui/`, plain HTML and JavaScript shipped
//! in the binary, which reads nothing but this API).
//!
//! # Errors
//!
//! Every error has one shape, `{"error": "what is wrong", "field": "job"}`, where
//! `field` names the request field at fault (its path inside the body, `id` for the
//! job in the URL, `body`, `content-type` or `path` for the request itself) or is
//! `null` when no field is at fault:
//!
//! - 400: a bad request: not JSON, a field of the wrong type (`{"job": 123}`: field
//!   `job`), missing or unknown, or a value out of range (`workers: 0`);
//! - 404: no such job (field `id`) or endpoint (field `path`);
//! - 409: a request the job cannot take now;
//! - 413: a body over [`MAX_BODY_BYTES`] (field `body`) or a job file over
//!   `job_spec::MAX_JOB_FILE_BYTES` (field `job`);
//! - 415: a body that is not `application/json` (field `content-type`);
//! - 500: anything else.

use std::sync::Arc;

use crate::auth::Tokens;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;
use sluice_planner::job_spec;
use tokio::net::TcpListener;
use tokio_util::task::AbortOnDropHandle;

use crate::service::{ApiError, Coordinator, SubmitOptions};

/// The OpenAPI description of this API.
pub const OPENAPI: &str = include_str!("../../docs/api/openapi.yaml");

/// The largest request body accepted: a job file at its limit, escaped as a JSON
/// string, with room to spare.
pub const MAX_BODY_BYTES: usize = 2 * job_spec::MAX_JOB_FILE_BYTES + (64 << 10);

/// The one JSON shape of every error.
fn error(code: StatusCode, message: &str, field: Option<&str>) -> Response {
    (
        code,
        axum::Json(json!({ "error": message, "field": field })),
    )
        .into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (code, field) = match &self {
            ApiError::BadRequest { field, .. } => (StatusCode::BAD_REQUEST, Some(field.as_str())),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, Some("id")),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, None),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, None),
            ApiError::TooLarge { field, .. } => {
                (StatusCode::PAYLOAD_TOO_LARGE, Some(field.as_str()))
            }
            ApiError::UnsupportedMediaType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, Some("content-type"))
            }
        };
        error(code, &self.to_string(), field)
    }
}

type ApiResult = Result<Response, ApiError>;

fn ok(value: impl serde::Serialize) -> ApiResult {
    Ok(axum::Json(value).into_response())
}

/// A request body as it arrived: within the size limit, and JSON when not empty.
fn checked(headers: &HeaderMap, bytes: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    let bytes = bytes.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::TooLarge {
                field: "body".into(),
                message: format!(
                    "the request body is larger than {} MiB",
                    MAX_BODY_BYTES >> 20
                ),
            }
        } else {
            ApiError::bad("body", format!("cannot read the request body: {r}"))
        }
    })?;
    if bytes.is_empty() {
        return Ok(bytes);
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if essence == "application/json" || essence.ends_with("+json") {
        return Ok(bytes);
    }
    let given = if content_type.is_empty() {
        "no content type".to_string()
    } else {
        format!("content type `{content_type}`")
    };
    Err(ApiError::UnsupportedMediaType(format!(
        "the request body must be JSON (Content-Type: application/json); it came with {given}"
    )))
}

/// Parses a JSON body; a mistake names the field at fault (its path in the body).
fn body<T: serde::de::DeserializeOwned>(bytes: &Bytes) -> Result<T, ApiError> {
    let invalid = |field: &str, e: &serde_json::Error| {
        ApiError::bad(field, format!("invalid request body: {e}"))
    };
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = inner.to_string();
        let field = if path != "." && !path.is_empty() {
            path
        } else {
            // Missing and unknown fields are reported at the object that lacks or has
            // them: their name is in the message.
            message
                .strip_prefix("missing field `")
                .or_else(|| message.strip_prefix("unknown field `"))
                .and_then(|rest| rest.split('`').next())
                .unwrap_or("body")
                .to_string()
        };
        invalid(&field, &inner)
    })?;
    de.end().map_err(|e| invalid("body", &e))?;
    Ok(value)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubmitRequest {
    /// The job file's text (YAML or SQL); without it, `from_savepoint` names the job
    /// to run again: the graph its savepoint recorded.
    #[serde(default)]
    job: Option<String>,
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

/// `POST /v1/sql`: a job written in SQL, as `sluice sql` sends it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SqlRequest {
    /// The statements: settings, tables and views, and one INSERT.
    sql: String,
    #[serde(default)]
    workers: Option<usize>,
    #[serde(default)]
    parallelism: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SavepointRequest {
    name: String,
}

#[derive(Deserialize, Default)]
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

async fn submit(
    State(c): State<Arc<Coordinator>>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let req: SubmitRequest = body(&checked(&headers, bytes)?)?;
    let file = req.file.unwrap_or_else(|| "job".into());
    check_workers(req.workers)?;
    let graph = match (&req.job, &req.from_savepoint) {
        (Some(job), _) => job_graph("job", &file, job)?,
        (None, Some(path)) => c.savepoint_graph(path).await?,
        (None, None) => {
            return Err(ApiError::bad(
                "job",
                "missing: the job file's text, or `from_savepoint` alone to run the savepoint's job again",
            ));
        }
    };
    let options = SubmitOptions {
        workers: req.workers,
        from_savepoint: req.from_savepoint,
        parallelism: req.parallelism,
        job_id: None,
    };
    created(c.submit(graph, options).await?)
}

/// A `workers` of 0 is refused.
fn check_workers(workers: Option<usize>) -> Result<(), ApiError> {
    match workers {
        Some(0) => Err(ApiError::bad("workers", "must be at least 1")),
        _ => Ok(()),
    }
}

/// The graph of the job file `text` (named `file`, YAML or SQL by its extension) sent
/// as `field`: refused when too large, or at its mistake's line and column.
fn job_graph(field: &str, file: &str, text: &str) -> Result<sluice_common::pb::JobGraph, ApiError> {
    if let Some(message) = job_spec::job_file_too_large(file, text.len() as u64) {
        return Err(ApiError::TooLarge {
            field: field.into(),
            message,
        });
    }
    sluice_planner::parse_job_file(file, text).map_err(|e| ApiError::bad(field, e.to_string()))
}

/// `201 Created` with the new job's id.
fn created(id: String) -> ApiResult {
    Ok((StatusCode::CREATED, axum::Json(json!({ "id": id }))).into_response())
}

async fn submit_sql(
    State(c): State<Arc<Coordinator>>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let req: SqlRequest = body(&checked(&headers, bytes)?)?;
    check_workers(req.workers)?;
    let graph = job_graph("sql", "query.sql", &req.sql)?;
    let options = SubmitOptions {
        workers: req.workers,
        parallelism: req.parallelism,
        ..SubmitOptions::default()
    };
    created(c.submit(graph, options).await?)
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
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let req: SavepointRequest = body(&checked(&headers, bytes)?)?;
    let path = c.savepoint(&id, &req.name).await?;
    ok(json!({ "path": path }))
}

async fn stop(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let bytes = checked(&headers, bytes)?;
    let req: StopRequest = if bytes.is_empty() {
        StopRequest::default()
    } else {
        body(&bytes)?
    };
    ok(c.stop(&id, req.savepoint).await?)
}

async fn rescale(
    State(c): State<Arc<Coordinator>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let req: RescaleRequest = body(&checked(&headers, bytes)?)?;
    ok(c.rescale(&id, req.parallelism).await?)
}

async fn workers(State(c): State<Arc<Coordinator>>) -> ApiResult {
    ok(c.workers())
}

/// A certificate for a worker joining with a join token (an auto-scaled one).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct JoinRequest {
    /// The worker's data address, which must be the one its request comes from.
    host: String,
    /// Its certificate signing request (PEM).
    csr: String,
}

async fn join_worker(
    State(c): State<Arc<Coordinator>>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let req: JoinRequest = body(&checked(&headers, bytes)?)?;
    let Some(axum::Extension(axum::extract::ConnectInfo(peer))) = peer else {
        return Err(ApiError::Internal(
            "the server does not know the caller's address".into(),
        ));
    };
    ok(c.join_worker(peer.ip(), &req.host, &req.csr)?)
}

async fn state_nodes(State(c): State<Arc<Coordinator>>) -> ApiResult {
    ok(c.state_nodes())
}

async fn drain_state_node(
    State(c): State<Arc<Coordinator>>,
    Path(node): Path<String>,
) -> ApiResult {
    ok(c.drain_state_node(&node).await?)
}

async fn rebalance(State(c): State<Arc<Coordinator>>) -> ApiResult {
    ok(c.rebalance_state().await)
}

async fn cluster(State(c): State<Arc<Coordinator>>) -> ApiResult {
    ok(serde_json::json!({
        "coordinator": { "pid": std::process::id() },
        "coordinators": c.coordinators().await,
        "workers": c.workers(),
        "state_nodes": c.state_nodes(),
    }))
}

async fn metrics(State(c): State<Arc<Coordinator>>) -> Response {
    let collector = sluice_telemetry::family::Merged(vec![
        Arc::new(crate::prometheus::CoordinatorMetrics(c)),
        Arc::new(sluice_telemetry::family::ProcessMetrics),
    ]);
    let text = sluice_telemetry::prometheus::render_collector(&collector);
    ([("content-type", crate::prometheus::CONTENT_TYPE)], text).into_response()
}

/// The web UI, shipped in the binary: plain HTML, CSS and JavaScript over this API.
const UI_HTML: &str = include_str!("../ui/index.html");
const UI_JS: &str = include_str!("../ui/app.js");
const UI_CSS: &str = include_str!("../ui/app.css");

async fn ui_file(content_type: &'static str, body: &'static str) -> Response {
    ([("content-type", content_type)], body).into_response()
}

async fn ui_root() -> Response {
    (StatusCode::FOUND, [(header::LOCATION, "/ui/")]).into_response()
}

async fn openapi() -> Response {
    ([("content-type", "application/yaml")], OPENAPI).into_response()
}

async fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "no such endpoint; see /v1/openapi.yaml",
        Some("path"),
    )
}

/// The API's routes; with `tokens`, every request but the public ones needs a bearer
/// token ([`crate::auth`]).
pub fn router(c: Arc<Coordinator>, tokens: Option<Arc<Tokens>>) -> Router {
    let router = Router::new()
        .route("/v1/jobs", get(jobs).post(submit))
        .route("/v1/jobs/{id}", get(job))
        .route("/v1/sql", post(submit_sql))
        .route("/v1/jobs/{id}/checkpoints", get(checkpoints))
        .route("/v1/jobs/{id}/cancel", post(cancel))
        .route("/v1/jobs/{id}/savepoints", post(savepoint))
        .route("/v1/jobs/{id}/stop", post(stop))
        .route("/v1/jobs/{id}/rescale", post(rescale))
        .route("/v1/workers", get(workers))
        .route("/v1/workers/join", post(join_worker))
        .route("/v1/state-nodes", get(state_nodes))
        .route("/v1/state-nodes/{node}/drain", post(drain_state_node))
        .route("/v1/state-nodes/rebalance", post(rebalance))
        .route("/v1/cluster", get(cluster))
        .route("/v1/openapi.yaml", get(openapi))
        .route("/metrics", get(metrics))
        .route("/", get(ui_root))
        .route("/ui/", get(|| ui_file("text/html; charset=utf-8", UI_HTML)))
        .route(
            "/ui/app.js",
            get(|| ui_file("text/javascript; charset=utf-8", UI_JS)),
        )
        .route(
            "/ui/app.css",
            get(|| ui_file("text/css; charset=utf-8", UI_CSS)),
        )
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            c.clone(),
            standby_refuses,
        ))
        .with_state(c);
    // Outermost, so that a caller without a token learns nothing, not even the leader.
    match tokens {
        Some(tokens) => router.layer(axum::middleware::from_fn_with_state(
            tokens,
            crate::auth::require_token,
        )),
        None => router,
    }
}

/// A standby answers 503 naming the leader (clients given every coordinator try the
/// next); its own `/metrics` stays readable.
async fn standby_refuses(
    State(c): State<Arc<Coordinator>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match c.serving() {
        Err(why) if request.uri().path() != "/metrics" => {
            let mut r = error(StatusCode::SERVICE_UNAVAILABLE, &why, None);
            r.headers_mut().insert(
                "x-sluice-standby",
                axum::http::HeaderValue::from_static("1"),
            );
            r
        }
        _ => next.run(request).await,
    }
}

/// Serves the API on `listener` (over TLS with `tls`) until the returned handle is
/// dropped.
pub fn serve(
    c: Arc<Coordinator>,
    listener: TcpListener,
    tokens: Option<Arc<Tokens>>,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> AbortOnDropHandle<()> {
    AbortOnDropHandle::new(tokio::spawn(async move {
        sluice_telemetry::http::serve_tls(listener, router(c, tokens), Default::default(), tls)
            .await;
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> (String, String) {
        match body::<SubmitRequest>(&Bytes::from(text.to_string())) {
            Err(ApiError::BadRequest { field, message }) => (field, message),
            Err(other) => panic!("{other:?}"),
            Ok(_) => panic!("{text} parsed"),
        }
    }

    #[test]
    fn a_body_error_names_the_field_not_the_value() {
        let (field, message) = err(r#"{"job": 123}"#);
        assert_eq!(field, "job");
        assert!(message.contains("invalid type: integer `123`"), "{message}");
        assert_eq!(err(r#"{"job": "x", "workers": -1}"#).0, "workers");
        // Without `job` the body parses: `from_savepoint` alone is a submission too, and
        // the handler refuses neither being given (see `submit`).
        assert!(body::<SubmitRequest>(&Bytes::from(r#"{"workers": 2}"#)).is_ok());
        assert_eq!(err(r#"{"job": "x", "wrokers": 2}"#).0, "wrokers");
        assert_eq!(err(r#"{"job": "x"} trailing"#).0, "body");
        assert_eq!(err("not json").0, "body");
    }

    #[test]
    fn a_body_must_be_json() {
        let json = |ct: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, ct.parse().unwrap());
            h
        };
        let b = || Ok(Bytes::from_static(b"{}"));
        assert!(checked(&json("application/json"), b()).is_ok());
        assert!(checked(&json("application/json; charset=utf-8"), b()).is_ok());
        assert!(matches!(
            checked(&json("text/plain"), b()),
            Err(ApiError::UnsupportedMediaType(m)) if m.contains("text/plain")
        ));
        assert!(matches!(
            checked(&HeaderMap::new(), b()),
            Err(ApiError::UnsupportedMediaType(_))
        ));
        // An empty body needs no content type (`POST /stop` without a savepoint).
        assert!(checked(&HeaderMap::new(), Ok(Bytes::new())).is_ok());
    }
}
