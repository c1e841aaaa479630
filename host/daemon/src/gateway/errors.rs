//! Errors the gateway answers itself, in the shape of the provider the client speaks to (G1):
//! an SDK's typed error parses them, and `x-promptd-error` names promptd's code.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use promptd_core::gateway::Provider;

/// A refusal of the gateway's own: the status, promptd's stable code and the message.
#[derive(Debug)]
pub struct GatewayRefusal {
    /// The provider whose error shape it takes.
    pub provider: Provider,
    /// The HTTP status.
    pub status: StatusCode,
    /// promptd's stable code (`x-promptd-error`).
    pub code: &'static str,
    /// What went wrong, naming the thing and the cause.
    pub message: String,
    /// `retry-after`, in seconds, for a limit's 429 (G12).
    pub retry_after: Option<HeaderValue>,
}

impl GatewayRefusal {
    /// A refusal.
    pub fn new(
        provider: Provider,
        status: StatusCode,
        code: &'static str,
        message: impl Into<String>,
    ) -> GatewayRefusal {
        GatewayRefusal {
            provider,
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// The provider's error `type` for the status (Anthropic's and OpenAI's names).
    fn kind(&self) -> &'static str {
        let anthropic = self.provider == Provider::Anthropic;
        match self.status.as_u16() {
            400 | 422 => "invalid_request_error",
            401 => {
                if anthropic {
                    "authentication_error"
                } else {
                    "invalid_request_error"
                }
            }
            403 => {
                if anthropic {
                    "permission_error"
                } else {
                    "invalid_request_error"
                }
            }
            429 => {
                if anthropic {
                    "rate_limit_error"
                } else if self.code == "key_spend_limit" {
                    "insufficient_quota"
                } else {
                    "requests"
                }
            }
            404 => {
                if anthropic {
                    "not_found_error"
                } else {
                    "invalid_request_error"
                }
            }
            413 => {
                if anthropic {
                    "request_too_large"
                } else {
                    "invalid_request_error"
                }
            }
            503 | 529 => {
                if anthropic {
                    "overloaded_error"
                } else {
                    "server_error"
                }
            }
            504 => {
                if anthropic {
                    "timeout_error"
                } else {
                    "server_error"
                }
            }
            _ => {
                if anthropic {
                    "api_error"
                } else {
                    "server_error"
                }
            }
        }
    }
}

impl IntoResponse for GatewayRefusal {
    fn into_response(self) -> Response {
        let message = format!("promptd gateway: {}", self.message);
        let body = match self.provider {
            Provider::Anthropic => json!({
                "type": "error",
                "error": { "type": self.kind(), "message": message },
            }),
            // Google's error shape: the HTTP code, and the canonical status it stands for.
            Provider::Gemini => json!({
                "error": {
                    "code": self.status.as_u16(),
                    "message": message,
                    "status": google_status(self.status),
                },
            }),
            // AWS's shape: the message alone, the type in `x-amzn-ErrorType` (below).
            Provider::Bedrock => json!({ "message": message }),
            Provider::Openai => json!({
                "error": {
                    "message": message,
                    "type": self.kind(),
                    "param": null,
                    "code": format!("promptd_{}", self.code),
                },
            }),
        };
        let mut response = (self.status, body.to_string()).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert("x-promptd-error", HeaderValue::from_static(self.code));
        if let Some(after) = self.retry_after {
            headers.insert(header::RETRY_AFTER, after);
        }
        if self.provider == Provider::Bedrock {
            headers.insert(
                "x-amzn-errortype",
                HeaderValue::from_static(aws_error_type(self.status)),
            );
        }
        response
    }
}

/// The google.rpc status an HTTP status stands for in Google's error shape.
fn google_status(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 413 | 422 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        501 => "UNIMPLEMENTED",
        502 | 503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    }
}

/// The AWS exception an HTTP status stands for in Bedrock Runtime's error shape.
fn aws_error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 413 | 422 => "ValidationException",
        401 | 403 => "AccessDeniedException",
        404 => "ResourceNotFoundException",
        409 => "ConflictException",
        429 => "ThrottlingException",
        502 | 503 => "ServiceUnavailableException",
        504 => "ModelTimeoutException",
        _ => "InternalServerException",
    }
}
