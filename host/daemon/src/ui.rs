//! The web inspector (issue 17): a single page served at `/ui/`, its four files embedded in the
//! binary, so the daemon needs nothing beside it and nothing is fetched from elsewhere.
//!
//! The pages are static and hold no data, so they are served without the token; every API call
//! they make sends it (the page asks for it on a 401 and keeps it in `sessionStorage`).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

const INDEX_HTML: &str = include_str!("../ui/index.html");
const APP_JS: &str = include_str!("../ui/app.js");
/// The usage page (issue 49), a script of its own beside app.js.
const USAGE_JS: &str = include_str!("../ui/usage.js");
const STYLE_CSS: &str = include_str!("../ui/style.css");

/// Only this origin's own files and API: no inline script or style, no other host, no frames.
/// (Styles set through the CSSOM, like the prefix bar's width, are not inline styles.)
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The inspector's routes: `GET /ui` (redirects), `/ui/`, `/ui/app.js`, `/ui/usage.js`,
/// `/ui/style.css`.
/// Generic over the state so it merges into any router.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route(
            "/ui/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/ui/index.html",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/ui/usage.js",
            get(|| async { asset("text/javascript; charset=utf-8", USAGE_JS) }),
        )
        .route(
            "/ui/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE_CSS) }),
        )
}

/// One embedded file with its headers. `no-cache`: a browser revalidates, so a new daemon's
/// page is never mixed with an old one's script.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, content_type),
        (header::CACHE_CONTROL, "no-cache"),
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assets_are_served_with_their_type_and_a_strict_policy() {
        for (content_type, body) in [
            ("text/html; charset=utf-8", INDEX_HTML),
            ("text/javascript; charset=utf-8", APP_JS),
            ("text/javascript; charset=utf-8", USAGE_JS),
            ("text/css; charset=utf-8", STYLE_CSS),
        ] {
            let response = asset(content_type, body);
            assert_eq!(response.status(), StatusCode::OK);
            let h = response.headers();
            assert_eq!(h[header::CONTENT_TYPE], content_type);
            assert_eq!(h[header::CACHE_CONTROL], "no-cache");
            let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
            assert!(csp.starts_with("default-src 'self'"), "{csp}");
            assert!(!csp.contains("unsafe"), "{csp}");
        }
    }

    /// The page must work offline and cannot inject data as markup: no other host is named,
    /// and the script never assigns HTML.
    #[test]
    fn the_page_loads_nothing_from_elsewhere_and_builds_no_html_from_strings() {
        for (name, text) in [
            ("index.html", INDEX_HTML),
            ("app.js", APP_JS),
            ("usage.js", USAGE_JS),
            ("style.css", STYLE_CSS),
        ] {
            for external in ["http://", "https://", "//cdn", "@import", "url("] {
                assert!(!text.contains(external), "ui/{name} contains `{external}`");
            }
        }
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            for (name, script) in [("app.js", APP_JS), ("usage.js", USAGE_JS)] {
                assert!(!script.contains(sink), "ui/{name} uses `{sink}`");
            }
        }
        // No inline script or style: the policy would block them.
        assert!(!INDEX_HTML.contains("<script>") && !INDEX_HTML.contains("style="));
        assert!(INDEX_HTML.contains(r#"<script src="/ui/app.js""#));
        assert!(INDEX_HTML.contains(r#"<script src="/ui/usage.js""#));
    }
}
