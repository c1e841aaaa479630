//! AWS Signature Version 4 (G9), as a pure function of the request and the credentials: the
//! gateway re-signs a Bedrock request it changed, since the client's signature covers the
//! body, host and path it no longer matches. HMAC-SHA256 is RFC 2104 over the tree's `sha2`
//! (the `hmac` in the lock is built for another `digest` major version).

use sha2::{Digest, Sha256};

/// Credentials the request is signed with.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The access key id.
    pub access_key_id: String,
    /// The secret access key.
    pub secret_access_key: String,
    /// A temporary credential's session token (`x-amz-security-token`).
    pub session_token: Option<String>,
}

// Never shown: a `Debug` of the config must not print the secret.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials(…)")
    }
}

/// What is signed.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// `POST`.
    pub method: &'a str,
    /// The path as sent (already percent-encoded).
    pub path: &'a str,
    /// The query as sent, without `?`.
    pub query: &'a str,
    /// The headers to sign, names lower-case (`host` among them); `x-amz-date` and, with a
    /// session token, `x-amz-security-token` are added by [`sign`].
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: &'a [u8],
}

/// What signing adds to the request's headers.
#[derive(Clone, PartialEq, Eq)]
pub struct Signed {
    /// `authorization`.
    pub authorization: String,
    /// `x-amz-date` (`YYYYMMDDTHHMMSSZ`).
    pub amz_date: String,
    /// `x-amz-security-token`, with a session token.
    pub security_token: Option<String>,
}

impl std::fmt::Debug for Signed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signed(…)")
    }
}

/// HMAC-SHA256 (RFC 2104).
pub fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |b: u8| block.iter().map(|k| k ^ b).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(data)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key a day's signatures are made with.
pub fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> [u8; 32] {
    let k = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k = hmac(&k, region.as_bytes());
    let k = hmac(&k, service.as_bytes());
    hmac(&k, b"aws4_request")
}

/// URI-encodes `s` as SigV4 does: unreserved bytes kept, `/` kept when `path`.
fn encode(s: &str, path: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'_' | b'.' | b'~')
            || (path && b == b'/')
        {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Signs `request` for `region` and `service` at `amz_date` (`YYYYMMDDTHHMMSSZ`). The path
/// is encoded once more, as AWS does for every service but S3 (so the `%3A` of a model id
/// is signed as `%253A`).
pub fn sign(
    request: &Request<'_>,
    credentials: &Credentials,
    region: &str,
    service: &str,
    amz_date: &str,
) -> Signed {
    let date = &amz_date[..amz_date.len().min(8)];
    let mut headers: Vec<(String, String)> = request
        .headers
        .iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_string()))
        .filter(|(n, _)| n != "x-amz-date" && n != "x-amz-security-token")
        .collect();
    headers.push(("x-amz-date".into(), amz_date.into()));
    if let Some(token) = &credentials.session_token {
        headers.push(("x-amz-security-token".into(), token.clone()));
    }
    headers.sort();
    let canonical_headers: String = headers.iter().map(|(n, v)| format!("{n}:{v}\n")).collect();
    let signed_headers = headers
        .iter()
        .map(|(n, _)| n.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let mut query: Vec<(String, String)> = (request.query.split('&'))
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (encode(k, false), encode(v, false))
        })
        .collect();
    query.sort();
    let query = (query.iter().map(|(k, v)| format!("{k}={v}")))
        .collect::<Vec<_>>()
        .join("&");
    let path = if request.path.is_empty() {
        "/"
    } else {
        request.path
    };
    let canonical = format!(
        "{}\n{}\n{query}\n{canonical_headers}\n{signed_headers}\n{}",
        request.method,
        encode(path, true),
        hex(&Sha256::digest(request.body))
    );
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex(&Sha256::digest(canonical.as_bytes()))
    );
    let key = signing_key(&credentials.secret_access_key, date, region, service);
    let signature = hex(&hmac(&key, to_sign.as_bytes()));
    Signed {
        authorization: format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
            credentials.access_key_id
        ),
        amz_date: amz_date.to_string(),
        security_token: credentials.session_token.clone(),
    }
}

/// `YYYYMMDDTHHMMSSZ` of a Unix time in seconds (UTC, the civil calendar).
pub fn amz_date(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let secs = unix_secs % 86_400;
    // Howard Hinnant's days-from-civil, inverted.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}
