//! Errors as the API answers them: one status and code for each error, in one place.

#[allow(unused_imports)]
use super::*;

/// An error response.
pub(crate) struct ApiError {
    status: StatusCode,
    body: ErrorBody,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            body: ErrorBody::new(code, message),
        }
    }
}

/// The HTTP status of a core error. Exhaustive on purpose: a new variant must be given one.
pub(crate) fn core_status(e: &Error) -> StatusCode {
    match e {
        Error::AtMessage { source, .. } => core_status(source),
        Error::BadRequest(_) | Error::InvalidAgent { .. } => StatusCode::BAD_REQUEST,
        Error::UnknownSession(_) | Error::UnknownStep { .. } | Error::UnknownPlugin(_) => {
            StatusCode::NOT_FOUND
        }
        Error::PluginCall { .. } | Error::UnknownShownTool { .. } => StatusCode::BAD_GATEWAY,
        Error::Store(StoreError::Conflict { .. }) => StatusCode::CONFLICT,
        // The database server is down or restarting: the client may retry the same call.
        Error::Store(StoreError::Unavailable { .. }) => StatusCode::SERVICE_UNAVAILABLE,
        Error::Store(StoreError::Corrupt { .. } | StoreError::Backend { .. })
        | Error::Engine { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        // Internal: a step that meets it is planned again where calls may be made.
        Error::WouldCall => StatusCode::INTERNAL_SERVER_ERROR,
        // Well-formed input that cannot be assembled or validated.
        Error::NotAComponent { .. }
        | Error::CompileLimit { .. }
        | Error::WrongWorld { .. }
        | Error::DeclareFailed { .. }
        | Error::Quarantined { .. }
        | Error::ConfigParse { .. }
        | Error::ConfigInvalid(_)
        | Error::ToolOrderDuplicate(_)
        | Error::ToolOrderMissingRest
        | Error::InvalidName { .. }
        | Error::InvalidReads { .. }
        | Error::DeclarationLimit { .. }
        | Error::ReservedToolName { .. }
        | Error::InvalidSchema { .. }
        | Error::InvalidScope { .. }
        | Error::DuplicateName { .. }
        | Error::Conflict { .. }
        | Error::DuplicatePlugin(_)
        | Error::MultipleComplete(_)
        | Error::UnknownToolOrderName { .. }
        | Error::MalformedReference { .. }
        | Error::UnknownVariable { .. }
        | Error::UnknownToolCall(_)
        | Error::ToolCallAnswered(_)
        | Error::OpenToolCalls(_)
        | Error::ToolResultsFirst { .. }
        | Error::EmptyMessage(_)
        | Error::ContextOverflow(_)
        | Error::InvalidCompaction(_)
        | Error::InvalidBlock { .. }
        | Error::UnsupportedBlock { .. }
        | Error::UnsupportedTool { .. }
        | Error::InvalidArguments { .. }
        | Error::ReplyBeforeStep
        | Error::MissingModelSetting { .. }
        | Error::DataPluginDeclares { .. }
        | Error::RefreshUnknown { .. }
        | Error::DeferUnknown { .. }
        | Error::ReviewRejected { .. }
        | Error::VariableAbsent { .. } => StatusCode::UNPROCESSABLE_ENTITY,
    }
}

/// The HTTP status of a daemon error; exhaustive like [`core_status`].
pub(crate) fn status(e: &DaemonError) -> StatusCode {
    match e {
        DaemonError::Core(e) => core_status(e),
        DaemonError::PluginDir { .. }
        | DaemonError::PluginRead { .. }
        | DaemonError::ConfigRead { .. }
        | DaemonError::Watch { .. }
        | DaemonError::WatchThread(_) => StatusCode::INTERNAL_SERVER_ERROR,
        DaemonError::PluginFileName { .. } | DaemonError::ReplayCandidate { .. } => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
        DaemonError::Loading { .. }
        | DaemonError::PluginSetBehind { .. }
        | DaemonError::PluginSetUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
        // Nobody reads it: the client is gone (nginx's "client closed request").
        DaemonError::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        DaemonError::PluginSetFiles { .. } | DaemonError::GatewayPluginTools { .. } => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
        DaemonError::Gateway(_) => StatusCode::BAD_REQUEST,
        DaemonError::ToolCallNotFound(_) => StatusCode::NOT_FOUND,
        DaemonError::ToolCallClosed(_) | DaemonError::ToolNotRunnable { .. } => {
            StatusCode::CONFLICT
        }
    }
}

impl From<DaemonError> for ApiError {
    fn from(e: DaemonError) -> Self {
        ApiError {
            status: status(&e),
            body: ErrorBody::from(&e),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": self.body});
        let mut response = json_bytes(self.status, body.to_string());
        if self.status == StatusCode::REQUEST_TIMEOUT {
            // The rest of a late body may still come: the connection ends with this answer.
            response.headers_mut().insert(
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            );
        }
        response
    }
}

pub(crate) type ApiResult = Result<Response, ApiError>;
